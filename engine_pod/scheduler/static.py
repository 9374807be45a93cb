"""Baselines: static batching (Fast-dLLM semantics) and sequential serving.

``StaticScheduler`` takes B requests in arrival order and runs them as one batch until the slowest
is done: every row stays in every forward of a block until the slowest row's block is complete,
finished rows stay in the batch (computed, never committed), and nothing is admitted before the whole
batch is done. With the masked suffix (``--canvas full``) each row materialises the prompt and the whole
generation budget (Fast-dLLM's sequence); without it the suffix, which attention would not see, is left
out. With B = 1 (rows leaving a forward once their block is complete) it is the sequential baseline:
one request at a time. Both default to the dense layout, as Fast-dLLM runs them (``layout="packed"``
computes only the positions that exist: outputs are the same).
"""

from __future__ import annotations

from collections import deque

from dllm_contracts.scheduler_config import LAYOUTS
from engine_pod.scheduler.base import ClaimPlan, Scheduler
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.request import Request


class StaticScheduler(Scheduler):
    gather_rows = False

    def __init__(
        self,
        block_length: int,
        eos_ids,
        batch_size: int,
        lockstep: bool = True,
        layout: str = "dense",
        **kwargs,
    ):
        super().__init__(block_length, eos_ids, **kwargs)
        if batch_size < 1:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.packed = layout == "packed"
        self.batch_size = batch_size
        self.gather_rows = not lockstep  # lockstep: every row stays in every forward, as Fast-dLLM runs
        self.waiting: deque[Request] = deque()
        self.batch: list[Request] = []

    def _next_cycle(self) -> SchedulerOutput:
        admitted = []
        if all(r.is_finished for r in self.batch):
            self.batch = []
            while self.waiting and len(self.batch) < self.batch_size:
                request = self.waiting.popleft()
                self._mark_running(request)
                self.batch.append(request)
                admitted.append(request.request_id)
        rows = [self._finished_row(r) if r.is_finished else self.row_of(r) for r in self.batch]
        widths = [self.row_width_of(row) for row in rows]
        return SchedulerOutput(
            request_ids=[r.request_id for r in self.batch],
            rows=rows,
            gather_rows=self.gather_rows,
            box_width=max(widths, default=0),
            row_total=sum(widths),
            admitted=admitted,
            packed=self.packed,
        )

    def _finished_row(self, request: Request) -> CycleRow:
        """A finished row stays in the batch, computed and never committed, as wide as the batch's other
        rows: EOS-filled up to the block the batch is on (to its full width with the masked suffix)."""
        L = self.block_length
        if self.masked_suffix:
            blocks = request.max_blocks - 1
        else:
            blocks = max((r.blocks_done(L) for r in self.batch if not r.is_finished), default=0)
        filled = request.generated + [next(iter(self.eos_ids), 0)] * (request.max_blocks * L)
        prefix = request.prompt_ids + tuple(filled[: min(blocks, request.max_blocks - 1) * L])
        return CycleRow(prefix, suffix_blocks=0, suffix_visible=True, active=False, owner=request.request_id)

    # -- claiming from a shared queue (the baselines behind the same queue as BlockServe) -----------
    def claim_plan(self) -> ClaimPlan | None:
        """Nothing while a batch runs (Fast-dLLM's batch admits nothing until its slowest row is done);
        then the requests that have waited longest, up to the batch size."""
        if not all(r.is_finished for r in self.batch) or self._room() < 1:
            return None
        return ClaimPlan(count=self._room(), max_prefix=0, oldest_first=True)

    def choose(self, candidates: list[Request]) -> list[Request]:
        """The oldest of ``candidates``, as many as the next batch takes."""
        return sorted(candidates, key=lambda r: r.arrival_time or 0.0)[: max(self._room(), 0)]

    def _room(self) -> int:
        """Requests the next batch takes beyond those already waiting for it."""
        return self.batch_size - len(self.waiting)

    def unadmittable(self) -> list[Request]:
        """None: the next batch takes every request waiting (a claim never exceeds its room)."""
        return []

    def _enqueue(self, request: Request) -> None:
        self.waiting.append(request)

    def _withdraw(self, request: Request) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        # a cancelled request in the running batch simply stops being committed


def sequential_scheduler(block_length: int, eos_ids, **kwargs) -> StaticScheduler:
    """One request at a time, in arrival order."""
    return StaticScheduler(block_length, eos_ids, batch_size=1, lockstep=False, **kwargs)
