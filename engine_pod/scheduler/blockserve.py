"""BlockServe: block-granularity continuous batching under a token budget (DESIGN.md section 2).

At every block boundary finished requests have left; this scheduler then (optionally) preempts
rows that would push the next cycle past the budget, admits pending requests by sand filling
(shortest prefix first, preferring those that fit inside the current box without widening it),
and hands the runner one mixed-state batch in which every row may be at a different block.
A candidate that widens the box is admitted only while the batch keeps at least
``min_padding_efficiency`` of its positions useful (0 turns this off).

Fairness: a request that has waited longer than ``max_wait_s`` since it was enqueued is admitted next
whatever its width, and nothing else is admitted before it (the rows running drain until it fits).

Cost(A) is what the batch's layout holds: packed (the default), the sum of its rows' widths
sum_i(p_i + (b_i + 1) L); dense, |A| x max_i(p_i + (b_i + 1) L). When the runner shares whole blocks
between rows (a block-diffusion model's prefix cache), a packed batch counts each block its rows hold in
common once: a row costs only what it holds beyond the blocks the batch has already. Two ways to keep it within the budget
at every cycle:
- ``projected``: admit against each row's peak width p_i + K_i L, so growth can never overflow;
- ``preempt``: admit against the next cycle's widths and, when rows have grown past the budget,
  send the most recently admitted rows back to the queue (they keep their committed blocks).

A worker that draws from a shared queue asks this scheduler what to claim (``claim_plan``, then
``choose`` among the candidates it read), so admission is decided here only, and every claimed
request is one this scheduler admits.
"""

from __future__ import annotations

from dataclasses import replace

from dllm_contracts.scheduler_config import SchedulerConfig, raise_problems
from engine_pod.scheduler.base import ClaimPlan, Scheduler
from engine_pod.scheduler.box import BatchBox
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.pending_queue import PendingQueue
from engine_pod.scheduler.prefill_chunks import PrefillChunks, prefill_chunk_tokens
from engine_pod.scheduler.request import Request, RequestError, RequestState
from engine_pod.scheduler.shared_blocks import PinnedBlocks, block_keys, shared_tokens
from engine_pod.scheduler.split_refresh import SplitRefreshes


class BlockServeScheduler(Scheduler):
    def __init__(self, block_length: int, eos_ids, config: SchedulerConfig, **kwargs) -> None:
        super().__init__(block_length, eos_ids, **kwargs)
        raise_problems(config.problems(block_length))
        self.config = config
        self.pending = PendingQueue()
        self.active: list[Request] = []  # in admission order
        self.pinned = PinnedBlocks()  # warm prefixes' blocks, held by the runner's prefix cache for good
        chunk = prefill_chunk_tokens(config.prefill_chunk, block_length, config.token_budget)
        self.chunks = PrefillChunks(chunk if self.chunks_prefill else 0, block_length)
        # a dual-cache row wider than two chunks refreshes a few layers per cycle (packed rows only)
        self.splits = SplitRefreshes(chunk if self.packed else 0, self.refresh_layers)

    @property
    def token_budget(self) -> int:
        """The budget rows are admitted against: the configured one less the warm prefixes' tokens."""
        return self.config.token_budget - self.pinned.tokens

    def pin_prefix(self, tokens: list[int]) -> int:
        """Count a warm prefix's whole blocks as held for good (the runner pinned them): their tokens come
        out of the budget, and a row holding them costs nothing more for them in a packed batch (as a
        block the batch's rows share does). Returns the tokens newly pinned."""
        return self.pinned.add(tokens, self.block_length)

    # -- widths and cost ------------------------------------------------------------------------
    def row_width(self, request: Request) -> int:
        """Tokens the request's row materialises in the next cycle."""
        if self.masked_suffix:
            return request.peak_width(self.block_length)
        return request.next_width(self.block_length)

    def admission_width(self, request: Request) -> int:
        if self.config.admission == "projected":
            return request.peak_width(self.block_length)
        return self.row_width(request)

    @property
    def packed(self) -> bool:
        return self.config.layout == "packed"

    def _box_of(self, requests: list[Request]) -> BatchBox:
        box = BatchBox(packed=self.packed)
        if self.shares_blocks and self.packed:
            box.held_blocks.update(self.pinned.keys)
        for request in requests:
            self._add(box, request)
        return box

    def held_row_width(self, width: int) -> int:
        """What a row of ``width`` positions costs against ``token_budget`` (no blocks shared)."""
        return width

    def _held_width(self, request: Request, box: BatchBox) -> int:
        """What admitting ``request`` adds to the batch's cost: its admission width, less the whole blocks
        the batch's rows hold already (when the runner shares them and the layout does not pad)."""
        if not (self.shares_blocks and self.packed) or self.chunks.chunks(request):
            return self.admission_width(request)
        keys = block_keys(request, self.block_length)
        return self.admission_width(request) - shared_tokens(keys, box.held_blocks, self.block_length)

    def _shared_in(self, requests: list[Request]) -> int:
        """Tokens of whole blocks the rows hold in common (each counted once): 0 unless shared."""
        if not (self.shares_blocks and self.packed):
            return 0
        held, shared = set(), 0
        for request in requests:
            if self.chunks.chunks(request):
                continue
            keys = block_keys(request, self.block_length)
            shared += shared_tokens(keys, held, self.block_length)
            held.update(keys)
        return shared

    def _add(self, box: BatchBox, request: Request) -> None:
        box.add(self._held_width(request, box), self.row_width(request))
        if self.shares_blocks and self.packed and not self.chunks.chunks(request):
            box.held_blocks.update(block_keys(request, self.block_length))

    def fits(self, request: Request) -> bool:
        """Whether the request can ever run here: its widest row, alone, within the budget."""
        return request.peak_width(self.block_length) <= self.token_budget

    def check_fits(self, request: Request) -> None:
        if not self.fits(request):
            raise RequestError(
                f"request {request.request_id} needs {request.peak_width(self.block_length)} tokens at its "
                f"last block (prompt {request.prompt_len} + {request.max_blocks} blocks of "
                f"{self.block_length}), more than the token budget {self.token_budget}{self.pinned.note()}"
            )

    # -- scheduling -----------------------------------------------------------------------------
    def _next_cycle(self) -> SchedulerOutput:
        preempted = self._preempt_overflow() if self.config.admission == "preempt" else []
        admitted = self._select(self.pending, self._box_of(self.active))
        for request in admitted:
            self._mark_running(request)
            self.active.append(request)
        rows = [self._split(r, self.row_of(r, self.chunks.chunk_end(r))) for r in self.active]
        widths = [self.row_width_of(row) for row in rows]
        return SchedulerOutput(
            request_ids=[r.request_id for r in self.active],
            rows=rows,
            gather_rows=True,
            box_width=max(widths, default=0),
            row_total=sum(self.row_width(r) for r in self.active) - self._shared_in(self.active),
            packed=self.packed,
            admitted=[r.request_id for r in admitted],
            preempted=[r.request_id for r in preempted],
        )

    def _split(self, request: Request, row: CycleRow) -> CycleRow:
        """``row`` with its refresh's split (scheduler/split_refresh.py), where it has one."""
        split = self.splits.split_of(request.request_id, self.row_width_of(row))
        return replace(row, refresh_split=split) if split[1] else row

    def _preempt_overflow(self) -> list[Request]:
        preempted = []
        while len(self.active) > 1 and self._box_of(self.active).cost > self.token_budget:
            victim = self.active.pop()
            victim.state = RequestState.PREEMPTED
            victim.num_preemptions += 1
            self.chunks.forget(victim.request_id)
            self.splits.forget(victim.request_id)
            self.pending.push(victim)
            preempted.append(victim)
        return preempted

    def _select(self, pending: PendingQueue, box: BatchBox) -> list[Request]:
        """Take from ``pending`` (removing them) the requests admitted next to the batch ``box``."""
        now, chosen = self.clock(), []
        held: set[str] = set()  # prompts waiting for another one's chunks: they keep their place
        while box.rows < self.config.max_rows:
            candidate = self._candidate(pending, box, now, held)
            if candidate is None or box.cost_with(self._held_width(candidate, box)) > self.token_budget:
                break  # an aged candidate that does not fit yet keeps its place: nobody overtakes it
            if not self._aged(candidate, now) and not self._dense_enough(candidate, box):
                break  # wider prompts wait for a batch of their own width (the queue is sorted)
            if not self.chunks.room_for(candidate, self.active + chosen):
                # another prompt's chunks are running: this one waits for them, aged or not, and the
                # requests behind it go on being admitted (they do not chunk, or wait the same way)
                held.add(candidate.request_id)
                continue
            pending.remove(candidate)
            self._add(box, candidate)
            chosen.append(candidate)
        return chosen

    def _aged(self, request: Request, now: float) -> bool:
        waited = now - (request.arrival_time if request.arrival_time is not None else now)
        return self.config.fairness and waited > self.config.max_wait_s

    def _dense_enough(self, candidate: Request, box: BatchBox) -> bool:
        """Whether the batch with ``candidate`` keeps its useful share of the box (no widening by a
        lone long prompt that would make every short row pay for its left padding)."""
        width = self.row_width(candidate)
        if box.rows == 0 or width <= box.widest_row:
            return True  # filling inside the box never adds padding
        return box.efficiency_with(width) >= self.config.min_padding_efficiency

    def _candidate(
        self, pending: PendingQueue, box: BatchBox, now: float, held: frozenset[str] | set[str] = frozenset()
    ) -> Request | None:
        """Aged requests first; else the shortest that fits inside the box; else the shortest (none of
        those ``held``)."""
        oldest = pending.longest_waiting(held)
        if oldest is not None and self._aged(oldest, now):
            return oldest
        if self.config.admission == "preempt":
            return pending.shortest(held)  # widths grow with the prefix: the shortest is inside if any is
        inside = next(
            (
                r
                for r in pending
                if r.request_id not in held and self.admission_width(r) <= box.widest_admission
            ),
            None,
        )
        return inside if inside is not None else pending.shortest(held)

    # -- claiming from a shared queue -----------------------------------------------------------
    def claim_plan(self) -> ClaimPlan | None:
        """What to read from the shared queue now; None when nothing could be admitted (rows or budget
        full, or requests of our own, such as preempted rows, are waiting: they go first)."""
        if len(self.pending):
            return None
        box = self._box_of(self.active)
        room = self.config.max_rows - box.rows
        widest_allowed = box.widest_addition(self.token_budget)
        if room < 1 or widest_allowed < self.block_length + 1:
            return None
        return ClaimPlan(count=room, max_prefix=widest_allowed - self.block_length)

    def choose(self, candidates: list[Request]) -> list[Request]:
        """Which of ``candidates`` (read from the shared queue, not ours yet) to claim: exactly those this
        scheduler would admit at the next block boundary. Candidates that can never fit are left out
        (see ``fits``)."""
        queue = PendingQueue([c for c in candidates if self.fits(c)])
        return self._select(queue, self._box_of(self.active))

    def unadmittable(self) -> list[Request]:
        """Pending requests the next cycle would not admit (after a claim that lost some candidates to
        another worker, a claimed request can be one: the worker hands it back)."""
        admitted = {r.request_id for r in self._select(self.pending.copy(), self._box_of(self.active))}
        return [r for r in self.pending if r.request_id not in admitted]

    # -- hooks ----------------------------------------------------------------------------------
    def _enqueue(self, request: Request) -> None:
        self.pending.push(request)

    def _withdraw(self, request: Request) -> None:
        self.chunks.forget(request.request_id)
        self.splits.forget(request.request_id)
        if request in self.active:
            self.active.remove(request)
        elif self.pending.find(request.request_id) is not None:
            self.pending.remove(request)

    def _after_update(self, output: SchedulerOutput, finished: list[Request]) -> None:
        done = {r.request_id for r in finished}
        self.active = [r for r in self.active if r.request_id not in done]
        for request_id in done:
            self.splits.forget(request_id)
        for request_id, row in zip(output.request_ids, output.rows):
            request = self.requests.get(request_id)
            if request_id not in done and request is not None:
                committed = len(request.prompt_ids) + len(request.generated) > len(row.prefix_ids)
                self.splits.ran(request_id, row.refresh_split, committed)
            if row.prefill_to:
                self.chunks.ran(request_id, row.prefill_to)
            elif request_id in self.chunks.done:
                self.chunks.forget(request_id)
