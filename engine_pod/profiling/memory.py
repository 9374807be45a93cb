"""Device memory: how much a device has, and the peak a piece of work used on it."""

from __future__ import annotations

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
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int:
    """CUDA: the allocator's peak since the last reset. CPU: this process's peak resident memory."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
