"""BlockServe: block-granularity continuous batching under a token budget (DESIGN.md section 2).

At every block boundary finished requests have left; this scheduler then (optionally) preempts
rows that would push the next cycle past the budget, admits pending requests by sand filling
(shortest prefix first, preferring those that fit inside the current box without widening it),
and hands the runner one mixed-state batch in which every row may be at a different block.
A candidate that widens the box is admitted only while the batch keeps at least
``min_padding_efficiency`` of its positions useful (0 turns this off; aged requests are exempt).

Two ways to keep Cost(A) = |A| x max_i(p_i + (b_i + 1) L) within the budget at every cycle:
- ``projected``: admit against each row's peak width p_i + K_i L, so growth can never overflow;
- ``preempt``: admit against the next cycle's widths and, when rows have grown past the budget,
  send the most recently admitted rows back to the queue (they keep their committed blocks).
"""

from __future__ import annotations

from engine_pod.scheduler.base import Scheduler
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.pending_queue import PendingQueue
from engine_pod.scheduler.request import Request, RequestError, RequestState

ADMISSION_MODES = ("preempt", "projected")
DEFAULT_MIN_PADDING_EFFICIENCY = 0.7  # measured: 0.92 padding on the heterogeneous workload, budget filled


class BlockServeScheduler(Scheduler):
    def __init__(
        self,
        block_length: int,
        eos_ids,
        token_budget: int,
        max_rows: int = 256,
        admission: str = "preempt",
        max_wait_cycles: int = 64,
        min_padding_efficiency: float = DEFAULT_MIN_PADDING_EFFICIENCY,
        **kwargs,
    ) -> None:
        super().__init__(block_length, eos_ids, **kwargs)
        if token_budget < block_length + 1:
            raise ValueError(f"token budget {token_budget} cannot hold even one block of {block_length}")
        if admission not in ADMISSION_MODES:
            raise ValueError(f"unknown admission mode {admission!r}; choose one of {ADMISSION_MODES}")
        if max_rows < 1:
            raise ValueError(f"max rows must be positive, got {max_rows}")
        if not 0.0 <= min_padding_efficiency <= 1.0:
            raise ValueError(f"min padding efficiency must be in [0, 1], got {min_padding_efficiency}")
        self.token_budget = token_budget
        self.max_rows = max_rows
        self.admission = admission
        self.max_wait_cycles = max_wait_cycles
        self.min_padding_efficiency = min_padding_efficiency
        self.pending = PendingQueue()
        self.active: list[Request] = []  # in admission order

    # -- widths and cost ------------------------------------------------------------------------
    def row_width(self, request: Request) -> int:
        """Tokens the request's row materialises in the next cycle."""
        if self.canvas == "full":
            return request.peak_width(self.block_length)
        return request.next_width(self.block_length)

    def admission_width(self, request: Request) -> int:
        if self.admission == "projected":
            return request.peak_width(self.block_length)
        return self.row_width(request)

    def _cost(self, requests: list[Request], extra: Request | None = None) -> int:
        widths = [self.admission_width(r) for r in requests]
        if extra is not None:
            widths.append(self.admission_width(extra))
        return len(widths) * max(widths, default=0)

    def check_fits(self, request: Request) -> None:
        peak = request.peak_width(self.block_length)
        if peak > self.token_budget:
            raise RequestError(
                f"request {request.request_id} needs {peak} tokens at its last block "
                f"(prompt {request.prompt_len} + {request.max_blocks} blocks of {self.block_length}), "
                f"more than the token budget {self.token_budget}"
            )

    # -- scheduling -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        for request in self.pending:
            request.waited_cycles += 1
        preempted = self._preempt_overflow() if self.admission == "preempt" else []
        admitted = self._admit()
        rows = [self._row(r) for r in self.active]
        box = max(
            (len(row.prefix_ids) + self.block_length * (1 + row.suffix_blocks) for row in rows), default=0
        )
        return SchedulerOutput(
            request_ids=[r.request_id for r in self.active],
            rows=rows,
            gather_rows=True,
            box_width=box,
            admitted=[r.request_id for r in admitted],
            preempted=[r.request_id for r in preempted],
        )

    def _row(self, request: Request) -> CycleRow:
        blocks_left = request.max_blocks - request.blocks_done(self.block_length) - 1
        suffix = blocks_left if self.canvas == "full" else 0
        return CycleRow(
            request.prompt_ids + tuple(request.generated),
            suffix_blocks=suffix,
            suffix_visible=True,
            threshold=request.threshold,
        )

    def _preempt_overflow(self) -> list[Request]:
        preempted = []
        while len(self.active) > 1 and self._cost(self.active) > self.token_budget:
            victim = self.active.pop()
            victim.state = RequestState.PREEMPTED
            victim.num_preemptions += 1
            self.pending.push(victim)
            preempted.append(victim)
        return preempted

    def _admit(self) -> list[Request]:
        admitted = []
        while len(self.active) < self.max_rows:
            candidate = self._candidate()
            if candidate is None or self._cost(self.active, candidate) > self.token_budget:
                break
            if not self._aged(candidate) and not self._dense_enough(candidate):
                break  # wider prompts wait for a batch of their own width (the queue is sorted)
            self.pending.remove(candidate)
            self._mark_running(candidate)
            self.active.append(candidate)
            admitted.append(candidate)
        return admitted

    def _aged(self, request: Request) -> bool:
        return request.waited_cycles > self.max_wait_cycles

    def _dense_enough(self, candidate: Request) -> bool:
        """Whether the batch with ``candidate`` keeps its useful share of the box (no widening by a
        lone long prompt that would make every short row pay for its left padding)."""
        widths = [self.row_width(r) for r in self.active]
        if not widths or self.row_width(candidate) <= max(widths):
            return True  # filling inside the box never adds padding
        widths.append(self.row_width(candidate))
        return sum(widths) >= self.min_padding_efficiency * len(widths) * max(widths)

    def _candidate(self) -> Request | None:
        """Aged requests first; else the shortest that fits inside the box; else the shortest."""
        oldest = self.pending.longest_waiting()
        if oldest is not None and self._aged(oldest):
            return oldest
        box = max((self.admission_width(r) for r in self.active), default=0)
        inside = next((r for r in self.pending if self.admission_width(r) <= box), None)
        return inside if inside is not None else self.pending.shortest()

    # -- hooks ----------------------------------------------------------------------------------
    def _enqueue(self, request: Request) -> None:
        self.pending.push(request)

    def _withdraw(self, request: Request) -> None:
        if request in self.active:
            self.active.remove(request)
        elif self.pending.find(request.request_id) is not None:
            self.pending.remove(request)

    def _after_update(self, output: SchedulerOutput, finished: list[Request]) -> None:
        done = {r.request_id for r in finished}
        self.active = [r for r in self.active if r.request_id not in done]
