"""Whether a group's other ranks are getting anywhere: what bounds a rank's wait in a collective on CPUs.

A collective waits for the slowest rank, and how long that rank computes depends on the machine and its
load (a rank whose experts drew more of a large batch's tokens computes longer), not on whether something
went wrong. So a wait is not cut at a fixed time: it ends with GroupFailed once it has lasted the group's
timeout and, for that long, no other rank has made progress (used CPU time), as when a rank is stopped
(SIGSTOP), frozen, or waits for something that never comes. A rank that died closes its connections and
ends the collective at once (gloo reports it).

Each rank's thread adds the CPU time its process used to a counter of its own in the group's rendezvous
store (rank 0's process holds it) every ``beat_s``, and reads the others'. A store that does not answer
(rank 0 stopped) shows no progress.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import torch.distributed as dist

logger = logging.getLogger(__name__)

BEATS_PER_TIMEOUT = 30  # a rank's counter is updated this many times within one collective timeout
MAX_BEAT_S = 1.0
PROGRESS_CPU_S = 0.05  # a rank progressed once its process used this much CPU time (more than the beats)
KEY = "dllm/progress/cpu-ms/{rank}"


class StalledGroup(Exception):
    """No other rank of the group made progress for the group's timeout while this one waited."""


class GroupProgress:
    """This rank's view of the others' progress, kept by a thread from the group's rendezvous store."""

    def __init__(self, rank: int, size: int, address: str, timeout_s: float) -> None:
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self.beat_s = min(MAX_BEAT_S, timeout_s / BEATS_PER_TIMEOUT)
        host, port = address.rsplit(":", 1)
        self._store = dist.TCPStore(
            host, int(port), is_master=False, timeout=timedelta(seconds=max(self.beat_s, 0.1))
        )
        self._published_ms = 0
        now = time.monotonic()
        # each other rank's CPU ms when it last grew by PROGRESS_CPU_S
        self._counted = {peer: 0 for peer in range(size) if peer != rank}
        self._last_progress = now
        self._last_beat = now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_until_stopped, name="group-progress", daemon=True)
        self._thread.start()

    def stalled_s(self) -> float:
        """Seconds since another rank last made progress."""
        return time.monotonic() - self._last_progress

    def wait(self, work, began: float) -> None:
        """Wait for ``work`` (an async collective) to complete, however long, while another rank makes
        progress; StalledGroup once the wait has lasted the timeout and none has for as long. A failed
        collective raises its own error."""
        while True:
            try:
                work.wait(timeout=timedelta(seconds=self.beat_s))
                return
            except RuntimeError:
                if work.is_completed():  # it failed (a rank's connection closed): its own error
                    raise
            waited, stalled = time.monotonic() - began, self.stalled_s()
            if waited >= self.timeout_s and stalled >= self.timeout_s:
                raise StalledGroup(f"no other rank made progress for {stalled:.0f} s")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s)

    def _beat_until_stopped(self) -> None:
        while not self._stop.wait(self.beat_s):
            now = time.monotonic()
            if now - self._last_beat > self.timeout_s / 2:  # this process was stopped itself: start again
                self._last_progress = now
            try:
                self._beat(now)
            except Exception as exc:  # noqa: BLE001 - an unreachable store shows no progress
                logger.debug("rank %d: the group's store did not answer: %s", self.rank, exc)
            self._last_beat = time.monotonic()

    def _beat(self, now: float) -> None:
        used_ms = int(time.process_time() * 1000)
        self._store.add(KEY.format(rank=self.rank), used_ms - self._published_ms)
        self._published_ms = used_ms
        for peer, counted in self._counted.items():
            count = self._store.add(KEY.format(rank=peer), 0)
            if count - counted >= PROGRESS_CPU_S * 1000:
                self._counted[peer] = count
                self._last_progress = now
