"""dLLM-Serve's phase multiplexing, decided on the device: which of a cycle's rows refresh at a step.

A row refreshes (its forward computes every position it attends and rewrites its dual cache) at the first
forward of its block (with a head-sparse selection delay d, at each of its first d + 1: the last selects)
and, with a refresh interval I > 0, at every I-th of its forwards after that; its other forwards reuse the
cache (they compute its block only). A refresh costs the row's whole width, a
reuse its block: the refresh quota caps the positions a step refreshes, so that a cycle's refreshes are
spread over its steps instead of all falling on the first. A row due for a refresh beyond the quota waits
the step out (it never reuses a stale cache), so the quota changes when a row's forwards run, never what
they compute: a request's tokens are those it gets alone.

Due rows are taken longest-waiting first (then in row order) and none overtakes another, so no row
starves; a row wider than the quota is taken alone when nothing else would step (the scheduler admits
none: scheduler/dllm_serve.py). The plan is made on the device from what it holds (each row's forwards,
waits and width), after the step's completion check and before the step's one read, which brings it to
the host with the rows' state: nothing is copied to the device for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PhasePlan:
    """One step's rows by phase, [R] flags on the device."""

    refresh: torch.Tensor
    reuse: torch.Tensor
    waiting: torch.Tensor


def plan_phases(
    going_on: torch.Tensor,
    forwards: torch.Tensor,
    waited: torch.Tensor,
    widths: torch.Tensor,
    interval: int,
    quota: int | None,
    delay: int = 0,
    ready: torch.Tensor | None = None,
) -> PhasePlan:
    """The step's phases of the rows ``going_on`` [R], by their ``forwards`` in their block so far, the
    steps they ``waited`` for a refresh and their refresh ``widths`` [R] (no read of the device); ``delay``:
    the forwards of a block that refresh before the first that may reuse; ``ready`` [R]: rows whose block's
    refresh is in their cache already (split across cycles, split_refresh.py): their first forward reuses."""
    due = going_on & (forwards <= delay)
    if interval > 0:
        due = due | (going_on & (forwards % interval == 0))
    if ready is not None:
        due = due & ~(ready & (forwards == 0))
    reuse = going_on & ~due
    if quota is None:
        return PhasePlan(due, reuse, torch.zeros_like(due))
    rows = due.shape[0]
    # longest-waiting first, then row order; rows not due last
    key = torch.where(due, -waited, waited.new_full((), 1))
    order = torch.argsort(key, stable=True)
    due_sorted = due[order]
    cumulative = torch.where(due_sorted, widths[order], 0).cumsum(0)
    taken = due_sorted & (cumulative <= quota)
    first = torch.arange(rows, device=due.device) == 0
    alone = first & due_sorted & ~reuse.any()  # nothing else steps: the first due row, whatever its width
    taken = taken | alone
    refresh = torch.zeros_like(due).scatter(0, order, taken)
    return PhasePlan(refresh, reuse, due & ~refresh)
