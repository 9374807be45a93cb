"""The bidirectional kind's stepper (LLaDA, Dream), run by the cycle driver (runner/cycle_driver.py).

A block cycle starts with a full forward over its rows (which refreshes the dual cache, cycle_cache.py),
then runs cached window forwards (the active block, or the block and its suffix) until every row's block
is complete. Rows whose block is complete stop costing compute when ``gather_rows`` is set (BlockServe);
without it every row stays in every forward (static batching, as Fast-dLLM does). Nothing is kept across
cycles: every cycle starts from the scheduler's rows (phase_stepper.py and split_stepper.py keep more)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.decoding.config import DecodingConfig
from engine_pod.decoding.denoise_step import Candidates, DenoiseStep
from engine_pod.decoding.grammar.setup import GrammarSource
from engine_pod.decoding.logprobs import LogprobRecorder
from engine_pod.decoding.policies import StepContext, make_policy
from engine_pod.device_buffers import DeviceBuffers
from engine_pod.kinds.bidirectional import grammar as grammar_hooks
from engine_pod.kinds.bidirectional.box_batches import box_refresh, box_window
from engine_pod.kinds.bidirectional.calibration import first_block_confidences
from engine_pod.kinds.bidirectional.cycle_box import CycleBox, box_regions, build_box
from engine_pod.kinds.bidirectional.cycle_cache import CycleCache, CycleCachePool
from engine_pod.kinds.bidirectional.head_sparse.hooks import refresh_heads, window_heads
from engine_pod.kinds.bidirectional.head_sparse.store import HeadSparse, position_bytes
from engine_pod.kinds.bidirectional.packing import refresh_inputs, window_inputs
from engine_pod.kinds.bidirectional.records import record_margins, trace_entry
from engine_pod.kinds.bidirectional.step_rows import HostState, StepRows
from engine_pod.runner.contract import CycleOutput, CycleStats
from engine_pod.runner.model_interface import ServedModel
from engine_pod.scheduler.output import SchedulerOutput


@dataclass
class _BidirectionalCycle:
    """One cycle's state between its steps."""

    box: CycleBox
    cache: CycleCache | None
    gather_rows: bool
    masks_at_start: torch.Tensor  # [R] masks in each row's block when the cycle began
    done: torch.Tensor  # [R] rows whose block is complete (or that never commit)
    steps_taken: torch.Tensor  # [R] forwards each row's block took
    output: CycleOutput
    margins: torch.Tensor  # [R, L] each committed position's top-two gap, where recorded
    recorder: LogprobRecorder | None
    host: HostState | None = None  # the last step's read
    phases: object | None = None  # each row's refresh schedule, where the cycle staggers refreshes
    grammar: object | None = None  # its constrained rows (decoding/grammar/rows.py; None: none)
    constrained: torch.Tensor | None = None  # [R] those rows, on the device (sent with their first step)
    pieces: object | None = None  # rows that computed a refresh piece instead (split_stepper.py)


class BidirectionalStepper:
    """The bidirectional kind's part of a block cycle (a ``Stepper`` of runner/cycle_driver.py)."""

    grid_aligned = False  # blocks follow each request's prompt, wherever it ends
    shares_blocks = False
    prefix_cache_stats = None  # no prefix cache: every cycle computes its rows' caches afresh
    request_defaults = None  # the family adds no per-request settings
    staggers_refreshes = False  # every row refreshes at its block's first forward (phase_stepper.py staggers)
    extra_columns = 0  # per-row integers its boxes carry beside the rows' own (CycleBox.extra)

    def __init__(
        self,
        loaded: ServedModel,
        decoding: DecodingConfig,
        pool_tokens: int | None = None,
        record_trace: bool = False,
        record_margins: bool = False,
    ) -> None:
        """``pool_tokens``: the dual cache's pool is sized for this many positions first (the token budget),
        and grows when a cycle needs more."""
        self.loaded = loaded
        self.model = loaded.model
        self.decoding = decoding
        self.quirks = loaded.family.quirks
        self.policy = make_policy(decoding.remasking)
        self.mask_id = loaded.config.mask_token_id
        self.pad_id = loaded.config.pad_token_id if loaded.config.pad_token_id is not None else 0
        self.record_trace = record_trace
        self.record_margins = record_margins
        self.trace: list[dict] = []  # row 0's forwards and their commits, across cycles, when recorded
        self.step_cap = self.quirks.step_cap(
            decoding.cache, decoding.steps_per_block, self.policy.quota_schedule
        )
        self.exact_steps = self.policy.quota_schedule and not decoding.uses_cache
        self.score_dtype = torch.promote_types(loaded.dtype, torch.float32)  # what scores are computed in
        self.denoise = DenoiseStep(self.policy, self.score_dtype, self.mask_id)
        self.grammars = GrammarSource(loaded, decoding.logit_candidates)
        self.forces_start = decoding.uses_cache and self.quirks.commits_block_start_on_refresh
        L = decoding.block_length
        self.heads = HeadSparse.of(loaded, decoding.sparse)  # None: every head keeps every position
        # head-sparse: a block's first forwards that compute every position before the one that selects
        self.selection_delay = decoding.sparse.selection_delay if self.heads is not None else 0
        self.position_bytes = position_bytes(loaded.config, loaded.dtype)
        new_pool = lambda pages: self.model.new_pool(pages, L, loaded.device)  # noqa: E731
        # head-sparse: the pool grows to what its first cycle keeps, which no budget says in advance
        initial = pool_tokens if self.heads is None else None
        self.cache_pool = CycleCachePool(new_pool, L, initial) if decoding.uses_cache else None
        # each cycle's box lists, in regions sized from the budget (where known) at fixed addresses
        self.buffers = DeviceBuffers(
            loaded.device, box_regions(pool_tokens, L, self.extra_columns) if pool_tokens else None
        )

    def begin(self, cycle: SchedulerOutput) -> _BidirectionalCycle:
        """The cycle's box (one copy to the device); packed: forwards compute only the positions that
        exist (no padding, no hidden suffix), else the dense box."""
        L, device = self.decoding.block_length, self.loaded.device
        box = self._box(cycle)
        box.packed = cycle.packed
        R = len(cycle.rows)
        cache = CycleCache(self.cache_pool, self.heads) if self.decoding.uses_cache else None
        if self.heads is not None:
            if not cycle.packed:
                raise ValueError("the head-sparse cache runs packed rows only (BlockServe's layout)")
            self.heads.release(cycle.released)
            cache.owners = [row.owner for row in cycle.rows]
        output = CycleOutput(blocks=[], steps=[], stats=CycleStats())
        recorder = None
        if box.logprobs is not None:
            output.logprobs = [[None] * L if k is not None else None for k in box.logprobs]
            recorder = LogprobRecorder(box.logprobs, output.logprobs)
        state = _BidirectionalCycle(
            box,
            cache,
            cycle.gather_rows,
            (box.block_tokens() == self.mask_id).sum(1),
            ~box.active,
            torch.zeros(R, dtype=torch.long, device=device),
            output,
            torch.full(box.block_slots.shape, float("inf"), device=device),
            recorder,
        )
        state.grammar = self.grammars.rows(cycle.rows, [[None] * L for _ in cycle.rows], device)
        return state

    def _box(self, cycle: SchedulerOutput, **resume) -> CycleBox:
        """The cycle's box (``resume``: resumed rows' blocks and columns, phase_carry.py)."""
        args = (self.mask_id, self.pad_id, self.loaded.device, self.decoding.threshold, self.score_dtype)
        return build_box(cycle.rows, self.decoding.block_length, *args, self.buffers, **resume)

    def most_steps(self, state: _BidirectionalCycle) -> int:
        return self.decoding.block_length + self.decoding.steps_per_block + 2 + self.selection_delay

    @torch.no_grad()
    def going_on(self, state: _BidirectionalCycle, step: int) -> bool:
        if step:
            state.done = state.done | self._finished(state.box, step, state.constrained)
        state.host = self._read_state(state.box, state.done, state.grammar)
        return not all(state.host.done)

    @torch.no_grad()
    def step(self, state: _BidirectionalCycle, step: int) -> None:
        # the selecting refresh (after the delay's full forwards) keeps entries of every row of the cycle
        unfinished = state.gather_rows and step > self.selection_delay
        inputs = grammar_hooks.before_step(state, unfinished, step == 0 and self.forces_start)
        rows = self._step_rows(state.box, state.done, state.host, unfinished)
        self._denoise_step(state, rows, step, inputs)
        state.steps_taken[rows.index] += (~state.done[rows.index]).long()

    def finish(self, state: _BidirectionalCycle) -> CycleOutput:
        output = state.output
        output.blocks = state.box.block_tokens().tolist()
        grammar_hooks.host_blocks(state.grammar, output)
        output.steps = state.steps_taken.tolist()
        if state.recorder is not None:
            state.recorder.finish()
        if self.record_margins:
            output.margins = state.margins.tolist()
        return output

    def end(self, state: _BidirectionalCycle) -> None:
        if state.cache is not None:
            state.cache.release()

    def forget(self) -> None:
        """Let go of what is kept across cycles: the head-sparse rankings of each request, if any."""
        if self.heads is not None:
            self.heads.forget()

    @torch.no_grad()
    def first_block_confidences(self, prompts: list[list[int]]) -> torch.Tensor:
        return first_block_confidences(self, prompts)

    def _finished(self, box: CycleBox, step: int, constrained: torch.Tensor | None) -> torch.Tensor:
        """Rows whose block is complete or whose steps are done (a constrained row's: when complete)."""
        at_cap = self.step_cap is not None and step >= self.step_cap
        if self.exact_steps and constrained is None:
            return torch.full_like(box.active, at_cap)
        complete = (box.block_tokens() != self.mask_id).all(1)
        return grammar_hooks.finished(complete, at_cap, self.exact_steps, constrained)

    def _read_state(self, box: CycleBox, done: torch.Tensor, grammar) -> HostState:
        """The step's one read from the device (the constrained rows' report with it: grammar_hooks.py)."""
        masked = box.block_tokens() == self.mask_id
        stack = torch.stack([done.long(), masked.sum(1), masked[:, 0].long()])
        return grammar_hooks.read_state(stack, grammar)[0]

    def _step_rows(
        self, box: CycleBox, done: torch.Tensor, state: HostState, only_unfinished: bool
    ) -> StepRows:
        rows = len(state.done)
        if only_unfinished:
            members = [r for r in range(rows) if not state.done[r]]
            # the unfinished rows in order, found on the device (stable: done rows sort after them)
            index = torch.argsort(done.to(torch.int8), stable=True)[: len(members)]
        else:
            members, index = list(range(rows)), torch.arange(rows, device=done.device)
        block = box.block_tokens(index)
        candidates = (block == self.mask_id) & ~done[index, None]
        counts = [0 if state.done[r] else state.masked[r] for r in members]
        first = [not state.done[r] and state.first_masked[r] for r in members]
        return StepRows(index, len(members) == rows, block, candidates, members, counts, first)

    def _denoise_step(self, state: _BidirectionalCycle, rows: StepRows, step: int, inputs=None) -> None:
        box, cache, out = state.box, state.cache, state.output
        refresh = step <= self.selection_delay or cache is None
        mask = rows.candidates
        forced_start = step == 0 and cache is not None and self.quirks.commits_block_start_on_refresh
        if forced_start:
            mask = mask.clone()
            mask[:, 1:] = False
        counts = [int(f) for f in rows.first_masked] if forced_start else rows.counts
        candidates = Candidates.of(mask, rows.index, sum(counts))
        picked = (counts, mask.sum(1))  # candidates per row, on the host and on the device
        args = (box, cache, rows, candidates.r, candidates.k, out.stats, picked)
        if refresh:
            logits = self._full_forward(*args, selects=step == self.selection_delay)
        else:
            logits = self._window_forward(*args)
        positions = box.position_ids.gather(1, box.block_slots)[candidates.owner, candidates.k]
        context = None if forced_start else self._context(box, step, rows, state.masks_at_start)
        grammar = grammar_hooks.step_of(inputs)
        commit = self.denoise(
            logits, candidates, rows.block, positions, step, box.sampling, context, state.recorder, grammar
        )
        box.write_block(rows.index, commit.blocks)
        grammar_hooks.keep_report(state, grammar, commit)
        if self.record_margins:
            record_margins(logits, candidates.r, candidates.k, commit.transfer, rows.index, state.margins)
        out.stats.forwards += 1
        if self.record_trace and int(rows.index[0]) == 0:
            kind = "full" if refresh else self.decoding.cache
            self.trace.append(trace_entry(box, kind, self.decoding.block_length, commit))

    def _context(self, box: CycleBox, step: int, rows: StepRows, masks_at_start: torch.Tensor) -> StepContext:
        return StepContext(
            step=step,
            steps_per_block=self.decoding.steps_per_block,
            masks_at_block_start=masks_at_start[rows.index],
            masks_now=rows.candidates.sum(1),
            threshold=box.thresholds[rows.index],
            eps=self.decoding.eps,
        )

    def _full_forward(
        self, box: CycleBox, cache, rows: StepRows, pick_r, pick_k, stats: CycleStats, picked, selects=True
    ):
        """A forward over every position the rows attend; with the dual cache it refreshes it, except a
        head-sparse forward within the selection delay (``selects`` false), which keeps nothing."""
        index = None if rows.all_rows else rows.index
        block_slots = box.block_slots if index is None else box.block_slots[index]
        source = block_slots[pick_r, pick_k] - self.quirks.logit_shift
        host = box.host
        stats.useful_positions += sum(host.context_lengths[r] for r in rows.members if host.active[r])
        if box.packed:
            inputs = refresh_inputs(box, index, cache, pick_r, source, rows.members, *picked)
            stats.computed_positions += inputs.computed
            stats.add_refresh(inputs.computed)
            if cache is not None and cache.heads is not None and selects:
                inputs.batch.heads = refresh_heads(box, cache, picked[0], self.loaded.config.num_layers)
            hidden = self.model.forward_batch(inputs.batch, (pick_r, inputs.select))
        else:
            stats.computed_positions += rows.index.shape[0] * box.width
            stats.add_refresh(rows.index.shape[0] * box.width)
            hidden = self.model.forward_batch(box_refresh(box, index, cache), (pick_r, source))
        if cache is not None and selects:
            cache.count_bytes(stats, self.position_bytes)
        return hidden

    def _window_forward(
        self, box: CycleBox, cache, rows: StepRows, pick_r, pick_k, stats: CycleStats, picked: tuple
    ):
        index = rows.index
        block_window = self.decoding.cache == "dual"  # every row's window is its block, all cached
        slots = box.block_slots[index] if block_window else box.prefix_window()[0][index]
        stats.useful_positions += sum(box.host.active[r] for r in rows.members) * box.block_length
        source = (pick_k - self.quirks.logit_shift).clamp(min=0)
        if box.packed:
            lengths = [box.block_length] * len(rows.members) if block_window else None
            inputs = window_inputs(box, cache, index, slots, pick_r, source, rows.members, *picked, lengths)
            stats.computed_positions += inputs.computed
            if cache.store is not None:
                inputs.batch.heads = window_heads(cache, rows.members, picked[0])
            return self.model.forward_batch(inputs.batch, (pick_r, inputs.select))
        stats.computed_positions += slots.numel()
        return self.model.forward_batch(box_window(box, cache, index, rows.all_rows, slots), (pick_r, source))
