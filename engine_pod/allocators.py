"""How every ``dllm`` process sets up its memory allocators (torch-free: it runs before torch loads)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
from pathlib import Path

CUDA_ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def configure_cuda_allocator() -> str:
    """Expandable segments for the CUDA caching allocator, unless the user chose a setting.

    Block cycles rebuild the KV cache with a different shape every cycle; fixed-size segments then
    fragment, and reserved memory drifts above what is allocated. Expandable segments keep the two
    close, so a budget profiled in one process holds in another. Must run before CUDA initialises;
    ``dllm`` calls it first thing, for the profiler and the engine alike (they must match).
    """
    return os.environ.setdefault(CUDA_ALLOC_CONF, EXPANDABLE_SEGMENTS)


M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20  # bytes: CPU allocations this large and larger come from mmap


def tune_cpu_allocator(mmap_threshold: int = MMAP_THRESHOLD) -> None:
    """Serve large CPU tensors from mmap so that freed activations leave the resident set at once.

    glibc's adaptive threshold otherwise keeps them in the heap, where reuse depends on history and
    peak resident memory stops being a function of the batch shape (which a token budget needs).
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)


def release_free_cpu_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``), so that resident memory is
    what live allocations hold; a no-op under another C library."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def describe_allocator(device: str) -> str:
    """The allocator a memory measurement on ``device`` ran under, in one line (what a profiled budget
    depends on beside the device): CUDA's caching allocator and its setting, or the C library's malloc as
    ``dllm`` tunes it (with what ``LD_PRELOAD`` puts in its place)."""
    if device.startswith("cuda"):
        return f"torch CUDA caching allocator, {CUDA_ALLOC_CONF}={os.environ.get(CUDA_ALLOC_CONF) or 'unset'}"
    name, version = platform.libc_ver()
    malloc = f"{name} {version} malloc".strip() if name else "the C library's malloc"
    tunables = os.environ.get("GLIBC_TUNABLES")
    preloaded = [Path(p).name for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()]
    return "; ".join(
        [f"{malloc}, mmap from {MMAP_THRESHOLD >> 20} MiB"]
        + ([f"GLIBC_TUNABLES={tunables}"] if tunables else [])
        + ([f"LD_PRELOAD={' '.join(preloaded)}"] if preloaded else [])
    )
