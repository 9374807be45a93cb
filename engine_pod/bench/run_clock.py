"""The clock an online run is timed by: the wall's, or the engine's own CPU seconds.

On a host shared with other work, wall-clock latencies move with the load from one run to the next. The
engine's clock counts the CPU seconds the run's process spends (on one torch thread: what an idle core
would take) and skips the idle time until the next arrival, so a run's latencies and throughput are what
an idle core would give, whatever else the host runs.
"""

from __future__ import annotations

import time

CLOCKS = ("wall", "engine-cpu")


class RunClock:
    """Seconds since the run began, by ``kind`` ("wall" or "engine-cpu"), and the wait for an arrival."""

    def __init__(self, kind: str = "wall") -> None:
        if kind not in CLOCKS:
            raise ValueError(f"unknown clock {kind!r}; choose from {', '.join(CLOCKS)}")
        self.kind = kind
        self._read = time.perf_counter if kind == "wall" else time.process_time
        self._start = self._read()
        self._skipped = 0.0  # engine-cpu: the idle seconds skipped while nothing had arrived

    def now(self) -> float:
        return self._read() - self._start + self._skipped

    def wait_until(self, at: float) -> None:
        """Until ``at`` seconds into the run: slept on the wall's clock, skipped on the engine's."""
        ahead = at - self.now()
        if ahead <= 0:
            return
        if self.kind == "wall":
            time.sleep(ahead)
        else:
            self._skipped += ahead
