"""torch threads that follow the load after start: looked at again between block cycles.

A count chosen once at start from a quarter-second sample (``cpu_threads.py``) holds only while the machine
stays as it was: a benchmark started on an idle machine that another process then keeps busy ran two
threads on two contended cores, each torch operation waiting for its slower thread (16 shared-prefix
requests took 120-138 s where one thread took 7-12 s). So an engine whose count was chosen by default (no
``--threads``, no ``DLLM_THREADS``) looks again between block cycles, at most every ``RESAMPLE_S``: how many
CPUs' worth other processes kept busy since it last looked (``/proc/stat`` less its own CPU time, over the
whole interval: no sampling pause), and sets the count the same rule gives now, lower when others keep CPUs
busy and higher again once they stop. The count never changes inside a forward: only the engine's own
thread calls ``between_cycles``, before it runs a cycle. A pinned count is never changed, and neither is one
that something else has set since (a tensor-parallel rank takes its share of the threads).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from engine_pod.cpu_threads import (
    PROC_STAT,
    FollowLoad,
    ThreadChoice,
    UsableCpus,
    choose_threads,
    cpu_times,
    own_cpu_s,
    set_torch_threads,
)

logger = logging.getLogger(__name__)

RESAMPLE_S = 1.0  # the engine looks at the load again at most this often (between block cycles)


class LoadSampler:
    """CPUs' worth of ``cpus`` other processes kept busy between two calls of ``busy_since_last``."""

    def __init__(
        self,
        cpus: frozenset[int],
        stat: Path = PROC_STAT,
        own: Callable[[], float] = own_cpu_s,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cpus, self.stat, self.own, self.clock = set(cpus), stat, own, clock
        self._last = self._read()

    def _read(self) -> tuple[dict[int, tuple[int, int]], float, float] | None:
        try:
            return cpu_times(self.stat, self.cpus), self.own(), self.clock()
        except (OSError, ValueError, IndexError):
            return None

    def busy_since_last(self) -> float | None:
        """Others' busy CPUs since the previous call (None: unreadable, or no time has passed)."""
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None or now[2] <= last[2]:
            return None
        (before, own_before, start), (after, own_after, end) = last, now
        busy = sum(
            (after[cpu][0] - before[cpu][0]) / max(after[cpu][1] - before[cpu][1], 1)
            for cpu in before
            if cpu in after
        )
        return max(0.0, busy - (own_after - own_before) / (end - start))


class ThreadFollower:
    """Sets torch's threads between block cycles to what the load allows now (see the module's doc)."""

    def __init__(
        self,
        follow: FollowLoad,
        threads: int,
        interval_s: float = RESAMPLE_S,
        sampler: LoadSampler | None = None,
        clock: Callable[[], float] = time.monotonic,
        set_threads: Callable[[int], None] = set_torch_threads,
        get_threads: Callable[[], int] | None = None,
    ) -> None:
        self.follow, self.threads, self.interval_s = follow, threads, interval_s
        self.sampler = sampler or LoadSampler(follow.affinity)
        self.clock, self.set_threads = clock, set_threads
        self.get_threads = get_threads or _torch_threads
        self.changes = 0  # how often it set another count
        self._looked = clock()

    def between_cycles(self) -> None:
        """Look again if ``interval_s`` has passed since the last look; set the count if it should change."""
        now = self.clock()
        if now - self._looked < self.interval_s:
            return
        self._looked = now
        busy = self.sampler.busy_since_last()
        if busy is None or self.get_threads() != self.threads:  # set by someone else since: theirs
            return
        usable = UsableCpus(len(self.follow.affinity), self.follow.quota, busy)
        wanted = usable.default_threads(self.follow.reserve)
        if wanted != self.threads:
            logger.info("torch threads: %d -> %d (%s)", self.threads, wanted, usable.describe())
            self.set_threads(wanted)
            self.threads, self.changes = wanted, self.changes + 1


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


_follower: dict[str, ThreadFollower] = {}  # this process's, once installed


def follow_load(follow: FollowLoad | None, threads: int) -> None:
    """From now on this process's engine follows the load from ``threads`` (None: it stops following)."""
    _follower.clear()
    if follow is not None:
        _follower["engine"] = ThreadFollower(follow, threads)


def pin_threads(threads: int) -> None:
    """Set ``threads`` and follow the load no more (a tensor-parallel rank runs its share of the count: the
    ranks of a group keep theirs alike)."""
    follow_load(None, threads)
    set_torch_threads(threads)


def following() -> FollowLoad | None:
    """What this process follows the load with (a spawned child is given it), or None (pinned)."""
    follower = _follower.get("engine")
    return follower.follow if follower is not None else None


def between_cycles() -> None:
    """The engine, before each block cycle: follow the load if this process does."""
    follower = _follower.get("engine")
    if follower is not None:
        follower.between_cycles()


def apply_threads(flag: str | None, level: int = logging.INFO, reserve: int = 0) -> ThreadChoice:
    """Choose this process's torch threads, set them, follow the load from them if chosen by default, and
    log why (at ``level``: a one-shot command whose report states them, such as ``dllm generate --json``,
    says it only at DEBUG, leaving the terminal to its answer or its one-line error)."""
    choice = choose_threads(flag, reserve=reserve)
    set_torch_threads(choice.threads)
    follow_load(choice.follow, choice.threads)
    logger.log(level, "%s", choice.log_line())
    return choice
