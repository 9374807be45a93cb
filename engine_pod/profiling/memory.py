"""Device memory: how much a device has, and the peak a piece of work used on it."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import resource
from pathlib import Path

import torch


def total_memory(device: torch.device) -> int:
    """Bytes of memory the device offers this process (CPU: RAM, or the cgroup limit if lower)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(physical, _cgroup_limit() or physical)


def _cgroup_limit() -> int | None:
    for path in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def reset_peak(device: torch.device) -> None:
    """Start a new peak window on CUDA. On CPU the peak is the whole process's, on purpose: an engine
    process also pays for its imports and its model load, so each grid point runs in a fresh child."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int:
    """CUDA: the allocator's peak since the last reset. CPU: this process's peak resident memory."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    return _resident_high_water_mark()


def _resident_high_water_mark() -> int:
    """VmHWM: this address space's peak since exec. Not ru_maxrss, which a spawned child inherits from
    the process it was forked from (Linux keeps it across execve), so a large parent would mask it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


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
