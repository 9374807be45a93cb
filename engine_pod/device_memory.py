"""Device memory: how much a device has, and the peak a piece of work used on it."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")
CLEAR_REFS = Path("/proc/self/clear_refs")
RESET_PEAK_RESIDENT = "5"  # clear_refs: peak resident memory (VmHWM) back to what is resident now (Linux 4.0)


@dataclass
class _ResidentPeak:
    """This process's CPU peak windows: the floor (its peak before the first) and whether they work."""

    floor: int | None = None
    windows: bool = False


_resident = _ResidentPeak()


def device_name(device: torch.device) -> str:
    """The device as the machine names it: a GPU's name, or the CPU's model (a memory budget measured on one
    holds on that one: the same model on another CPU, or another allocator, can peak otherwise)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name as /proc/cpuinfo gives it (its vendor id where there is none); "cpu" unread."""
    try:
        fields = dict(
            (key.strip(), value.strip())
            for key, _, value in (line.partition(":") for line in cpuinfo.read_text().splitlines())
            if value
        )
    except OSError:
        return "cpu"
    return fields.get("model name") or fields.get("vendor_id") or fields.get("CPU implementer") or "cpu"


def total_memory(device: torch.device) -> int:
    """Bytes of memory the device has (CPU: RAM, or the cgroup limit if lower)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(physical, _cgroup_limit() or physical)


def available_memory(device: torch.device) -> int:
    """Bytes this process can use now. CUDA: what the driver reports free (other processes' memory and
    the CUDA context excluded) plus what this process's allocator already holds; CPU: ``total_memory``."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device))
    return total_memory(device)


def address_space_left() -> int | None:
    """Bytes of address space this process may still map under its limit (``ulimit -v``, RLIMIT_AS), or
    None without one."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    return max(0, limit - _status_kib("VmSize") * 1024)


def _status_kib(field: str) -> int:
    """A size in /proc/self/status (kB), 0 where it cannot be read."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _cgroup_limit() -> int | None:
    for path in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def reset_peak(device: torch.device, resident_window: bool = False) -> None:
    """Start a new peak window on CUDA (cached blocks released, so reserved memory starts from what is
    allocated). On CPU the peak is the whole process's: an engine process also pays for its imports and
    its model load. With ``resident_window`` (the profiler's points) a CPU window starts too: peak
    resident memory back to what is resident now (Linux's ``clear_refs``), with the process's peak before
    its first window kept as the floor of every window, so that a window's peak is what a fresh process
    doing the same work reaches. Where the kernel refuses the reset the peak stays the whole process's
    (``resident_windows`` says which)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return
    if not resident_window:
        return
    if _resident.floor is None:
        _resident.floor = _resident_high_water_mark()
    try:
        CLEAR_REFS.write_text(RESET_PEAK_RESIDENT)
        _resident.windows = True
    except OSError:
        _resident.windows = False


def resident_windows() -> bool:
    """Whether this process's last CPU ``reset_peak`` started a window of its own."""
    return _resident.windows


def peak_bytes(device: torch.device) -> int:
    """The memory a piece of work held at its peak. CUDA: the caching allocator's reserved peak since the
    last reset (allocations plus the cache and fragmentation around them: what the device gives up);
    CPU: this process's peak resident memory (in its window, at least the floor: ``reset_peak``)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_reserved(device))
    return max(_resident.floor or 0, _resident_high_water_mark())


def peak_allocated_bytes(device: torch.device) -> int:
    """CUDA: the peak of live tensor bytes since the last reset (at most ``peak_bytes``); CPU: 0."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    return 0


def _resident_high_water_mark() -> int:
    """VmHWM: this address space's peak since exec or its last reset. Not ru_maxrss, which a spawned child
    inherits from the process it was forked from (Linux keeps it across execve), so a large parent would
    mask it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
