"""dLLM-Serve's phase multiplexing: which of a block cycle's rows refresh their dual cache at a step.

A row refreshes (its forward computes every position it attends and rewrites its dual cache) at the first
forward of its block and, with a refresh interval I > 0, at every I-th of its forwards after that; its
other forwards reuse the cache (they compute its block only). A refresh costs the row's whole width, a
reuse its block: the refresh quota caps the positions a step refreshes, so that a cycle's refreshes are
spread over its steps instead of all falling on the first. A row due for a refresh beyond the quota waits
the step out (it never reuses a stale cache), so the quota changes when a row's forwards run, never
what they compute: a request's tokens are those it gets alone.

Due rows are taken longest-waiting first and none overtakes another (no row starves); a row wider than
the quota alone is taken when nothing else would step (the scheduler admits none: see
scheduler/dllm_serve.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepPhases:
    """One step's rows by phase (row numbers in the cycle, in row order)."""

    refresh: list[int]
    reuse: list[int]
    waiting: list[int]
    refresh_tokens: int  # positions the step's refreshes compute

    @property
    def stepping(self) -> list[int]:
        return sorted(self.refresh + self.reuse)


def refresh_due(forwards: int, interval: int) -> bool:
    """Whether a row that has taken ``forwards`` forwards in its block refreshes at its next one."""
    return forwards == 0 or (interval > 0 and forwards % interval == 0)


def step_phases(
    going_on: Sequence[bool],
    forwards: Sequence[int],
    waited: Sequence[int],
    widths: Sequence[int],
    interval: int,
    quota: int | None,
) -> StepPhases:
    """The step's phases: rows ``going_on`` whose refresh is due (by their ``forwards`` so far and the
    ``interval``) refresh while their ``widths`` fit the ``quota`` (None: no cap), taken by most steps
    ``waited``; the rest of them wait; every other row going on reuses its cache."""
    reuse = [r for r, on in enumerate(going_on) if on and not refresh_due(forwards[r], interval)]
    due = [r for r, on in enumerate(going_on) if on and refresh_due(forwards[r], interval)]
    due.sort(key=lambda r: (-waited[r], r))
    refresh, tokens = [], 0
    for place, row in enumerate(due):
        if quota is not None and tokens + widths[row] > quota and (refresh or reuse):
            waiting = sorted(due[place:])
            return StepPhases(sorted(refresh), reuse, waiting, tokens)
        refresh.append(row)
        tokens += widths[row]
        if quota is not None and tokens > quota:  # a row wider than the quota, alone: nothing else steps
            return StepPhases(refresh, reuse, sorted(due[place + 1 :]), tokens)
    return StepPhases(sorted(refresh), reuse, [], tokens)
