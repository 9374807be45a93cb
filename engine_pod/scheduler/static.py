"""Baselines: static batching (Fast-dLLM semantics) and sequential serving.

``StaticScheduler`` takes B requests in arrival order and runs them as one batch until the slowest
is done: each row materialises the prompt and the full generation budget, finished rows stay in
the batch (computed, never committed), and nothing is admitted before the whole batch is done.
With ``materialize_suffix=False`` and B = 1 it is the sequential baseline: one request at a time,
laid out exactly as the canvas mode says. Both default to the dense layout, as Fast-dLLM runs them
(``layout="packed"`` computes only the positions that exist: outputs are the same).
"""

from __future__ import annotations

from collections import deque

from engine_pod.scheduler.base import Scheduler
from engine_pod.scheduler.config import LAYOUTS
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
        materialize_suffix: bool = True,
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
        self.materialize_suffix = materialize_suffix
        self.gather_rows = not materialize_suffix
        self.waiting: deque[Request] = deque()
        self.batch: list[Request] = []

    def schedule(self) -> SchedulerOutput:
        admitted = []
        if all(r.is_finished for r in self.batch):
            self.batch = []
            while self.waiting and len(self.batch) < self.batch_size:
                request = self.waiting.popleft()
                self._mark_running(request)
                self.batch.append(request)
                admitted.append(request.request_id)
        rows = [self._row(r) for r in self.batch]
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

    def _row(self, request: Request) -> CycleRow:
        L = self.block_length
        if request.is_finished:
            filled = request.generated + [next(iter(self.eos_ids), 0)] * (request.max_blocks * L)
            prefix = request.prompt_ids + tuple(filled[: (request.max_blocks - 1) * L])
            return CycleRow(prefix, suffix_blocks=0, suffix_visible=True, active=False)
        prefix = request.prompt_ids + tuple(request.generated)
        blocks_left = request.max_blocks - request.blocks_done(L) - 1
        if self.materialize_suffix:
            return CycleRow(
                prefix,
                blocks_left,
                self.canvas == "full",
                threshold=request.threshold,
                sampling=request.sampling,
                logprobs=request.logprobs,
            )
        suffix = blocks_left if self.canvas == "full" else 0
        return CycleRow(
            prefix,
            suffix_blocks=suffix,
            suffix_visible=True,
            threshold=request.threshold,
            sampling=request.sampling,
            logprobs=request.logprobs,
        )

    def _enqueue(self, request: Request) -> None:
        self.waiting.append(request)

    def _withdraw(self, request: Request) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        # a cancelled request in the running batch simply stops being committed


def sequential_scheduler(block_length: int, eos_ids, **kwargs) -> StaticScheduler:
    """One request at a time, in arrival order."""
    return StaticScheduler(block_length, eos_ids, batch_size=1, materialize_suffix=False, **kwargs)
