"""How every ``dllm`` process sets up its memory allocators (torch-free: it runs before torch loads)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

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


def tune_cpu_allocator(mmap_threshold: int = 1 << 20) -> None:
    """Serve large CPU tensors from mmap so that freed activations leave the resident set at once.

    glibc's adaptive threshold otherwise keeps them in the heap, where reuse depends on history and
    peak resident memory stops being a function of the batch shape (which a token budget needs).
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None
