"""How many threads torch runs in a ``dllm`` engine process: fitted to the CPUs the process may use.

The CPUs a process may use are the fewer of its affinity (``os.sched_getaffinity``: taskset, a cpuset, a
static CPU manager) and its cgroup's CPU quota, rounded up (a container's CPU limit: cgroup v2
``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, the tightest over the process's cgroup and
its ancestors). torch's own default counts the machine's cores and ignores the quota, so in a pod whose CPU
limit is below the node's cores its threads outnumber the CPUs it gets, and the kernel throttles them.

The default is a thread for each usable CPU that no other process keeps busy, and at least one: a short
sample of ``/proc/stat`` at start (``BUSY_SAMPLE_S``) tells how many CPUs' worth of the usable ones other
processes are using, and the engine looks again between block cycles (``cpu_load.py``: the count follows
the load after start). Every torch operation waits for its slowest thread, so a thread that shares its core
with a busy neighbour stalls all the others: on 2 cores two threads ran about 1.6x one thread's throughput
on a quiet machine and about 0.6x of it with one core busy (``scripts/threads_bench.py``,
docs/benchmarks.md, "Torch threads"). ``dllm serve`` also keeps one CPU for the gateway, Redis and the
clients on the same machine (``reserve``). ``--threads`` or ``DLLM_THREADS`` (the operator sets it from an
engine pod's CPU request) pin the count, and then nothing is sampled.

Only the intra-op threads are set: torch's inter-op pool serves ``torch.jit.fork`` and similar
asynchronous work, which the engine never starts, so its threads are never created.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dllm_contracts.engine_env import THREADS_ENV

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
_V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


BUSY_SAMPLE_S = 0.25  # how long the default samples what other processes keep busy
PROC_STAT = Path("/proc/stat")
PROC_SELF_STAT = Path("/proc/self/stat")


@dataclass(frozen=True)
class UsableCpus:
    affinity: int  # CPUs in this process's affinity mask
    quota: float | None  # the cgroup's CPU quota in CPUs (a limit of 1500m: 1.5); None: no quota
    busy: float = 0.0  # CPUs' worth of the usable ones other processes kept busy when sampled

    @property
    def count(self) -> int:
        """The CPUs this process may use: its affinity, capped by its quota rounded up."""
        if self.quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.ceil(self.quota)))

    def default_threads(self, reserve: int = 0) -> int:
        """A thread per usable CPU that others do not keep busy (a busy one: half a CPU's worth or more),
        less ``reserve`` CPUs kept for neighbours to come; at least one."""
        return max(1, self.count - math.floor(self.busy + 0.5) - reserve)

    def describe(self) -> str:
        quota = "none" if self.quota is None else f"{self.quota:g}"
        cpus = "CPU" if self.count == 1 else "CPUs"
        return (
            f"{self.count} {cpus} usable: affinity {self.affinity}, cgroup quota {quota}, "
            f"{self.busy:.1f} busy with other processes"
        )


def usable_cpus(
    root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP, sample_s: float = 0.0
) -> UsableCpus:
    """The usable CPUs; with ``sample_s`` > 0, how busy other processes keep them, sampled that long."""
    affinity = os.sched_getaffinity(0)
    busy = busy_elsewhere(affinity, sample_s) if sample_s > 0 else 0.0
    return UsableCpus(len(affinity), cgroup_cpu_quota(root, self_cgroup), busy)


def busy_elsewhere(cpus: set[int], sample_s: float, stat: Path = PROC_STAT) -> float:
    """CPUs' worth of ``cpus`` that processes other than this one kept busy over ``sample_s`` seconds:
    their busy share in ``/proc/stat`` less this process's own CPU time. 0.0 where it cannot be read."""
    try:
        before, own_before = cpu_times(stat, cpus), own_cpu_s()
        time.sleep(sample_s)
        after, own_after = cpu_times(stat, cpus), own_cpu_s()
    except (OSError, ValueError, IndexError):
        return 0.0
    busy = sum(
        (after[cpu][0] - before[cpu][0]) / max(after[cpu][1] - before[cpu][1], 1)
        for cpu in before
        if cpu in after
    )
    return max(0.0, busy - (own_after - own_before) / sample_s)


def cpu_times(stat: Path, cpus: set[int]) -> dict[int, tuple[int, int]]:
    """Per CPU in ``cpus``: (busy, total) clock ticks since boot, from ``/proc/stat``'s ``cpuN`` lines."""
    times = {}
    for line in stat.read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(field) for field in fields[:8]]  # user nice system idle iowait irq softirq steal
        idle = ticks[3] + ticks[4]
        times[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return times


def own_cpu_s() -> float:
    """This process's CPU time (all its threads), in seconds."""
    return time.process_time()


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """The tightest CPU quota over this process's cgroup and its ancestors, in CPUs; None if none is set."""
    quotas = [quota for folder in _cpu_cgroup_folders(root, self_cgroup) if (quota := _quota_in(folder))]
    return min(quotas, default=None)


def _cpu_cgroup_folders(root: Path, self_cgroup: Path) -> Iterator[Path]:
    """Where this process's CPU limits can be: its cgroup v2 folder and the v1 CPU controller's, each with
    their ancestors. Inside a container the root is the container's own cgroup, where the path that
    ``/proc/self/cgroup`` names does not exist: the root itself is then read."""
    paths = _own_cgroup_paths(self_cgroup)
    mounts = [(root, paths.get("", "/"))] + [(root / name, paths.get("cpu", "/")) for name in _V1_CPU_MOUNTS]
    for base, own in mounts:
        parts = PurePosixPath(own).parts[1:]
        for depth in range(len(parts), -1, -1):
            folder = base.joinpath(*parts[:depth])
            if folder.is_dir():
                yield folder


def _own_cgroup_paths(self_cgroup: Path) -> dict[str, str]:
    """``/proc/self/cgroup``'s paths: "" for the cgroup v2 line, "cpu" for the v1 CPU controller's."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return {}
    paths = {}
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and not controllers:
            paths[""] = path
        elif "cpu" in controllers.split(","):
            paths["cpu"] = path
    return paths


def _quota_in(folder: Path) -> float | None:
    """The quota one cgroup folder sets: v2 ``cpu.max`` ("max 100000" or "150000 100000"), else v1's pair."""
    try:
        if (folder / "cpu.max").is_file():
            quota, period = (folder / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if (folder / "cpu.cfs_quota_us").is_file():
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
            return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None
    return None


@dataclass(frozen=True)
class FollowLoad:
    """How a count chosen by default follows the load after start (``cpu_load.py``; picklable: a spawned
    benchmark child is given it)."""

    affinity: frozenset[int]  # the CPUs to watch
    quota: float | None  # the cgroup's CPU quota (see UsableCpus)
    reserve: int = 0  # CPUs kept for neighbours (dllm serve's gateway and Redis)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str  # why: the flag, the variable, or the usable CPUs
    follow: FollowLoad | None = None  # a default count follows the load; a pinned one (None) does not

    def log_line(self) -> str:
        return f"torch threads: {self.threads} ({self.reason})"

    def as_dict(self) -> dict:
        return {"threads": self.threads, "reason": self.reason, "follows_load": self.follow is not None}


PINNED = ThreadChoice(1, "--pin: the engine on one core")


def parse_threads(text: str, name: str) -> int:
    """A thread count given as ``--threads`` or ``DLLM_THREADS``; ValueError naming ``name`` if it is not a
    positive integer."""
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {text!r}")
    return value


def choose_threads(
    flag: str | None,
    environ: Mapping[str, str] | None = None,
    cpus: UsableCpus | None = None,
    reserve: int = 0,
) -> ThreadChoice:
    """The flag, else ``DLLM_THREADS``, else a thread per usable CPU other processes leave free, less
    ``reserve`` (CPUs kept for neighbours that start later: ``dllm serve``'s gateway and Redis)."""
    environ = os.environ if environ is None else environ
    chosen = flag is not None or environ.get(THREADS_ENV, "").strip()
    cpus = cpus or usable_cpus(sample_s=0.0 if chosen else BUSY_SAMPLE_S)
    if flag is not None:
        threads = parse_threads(flag, "--threads")
        return ThreadChoice(threads, f"--threads {threads}; {cpus.describe()}")
    if environ.get(THREADS_ENV, "").strip():
        threads = parse_threads(environ[THREADS_ENV], THREADS_ENV)
        return ThreadChoice(threads, f"{THREADS_ENV}={threads}; {cpus.describe()}")
    kept = f"; {reserve} kept for the gateway and Redis" if reserve else ""
    reason = f"{cpus.describe()}{kept}; follows the load; --threads or {THREADS_ENV} to pin"
    follow = FollowLoad(frozenset(os.sched_getaffinity(0)), cpus.quota, reserve)
    return ThreadChoice(cpus.default_threads(reserve), reason, follow)


def set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
