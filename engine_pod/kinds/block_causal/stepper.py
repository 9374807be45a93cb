"""The block-causal kind's stepper (LLaDA2.0, SDAR: the block-diffusion families), run by the cycle driver
(runner/cycle_driver.py).

Keeps each request's place in the exact KV cache across block cycles, keyed by the row's owner: a row
whose committed tokens are the ones cached last cycle reuses them; a request the scheduler names as
released (finished, cancelled, preempted) gives its pages back, and one that comes back recomputes its
cache from its committed tokens at its next cycle. The pool holds the token budget's pages. A cycle's
layout and each step's queries: cycle_layout.py; its forward batches:
batches.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine_pod.decoding.config import DecodingConfig, DecodingConfigError
from engine_pod.decoding.denoise_step import Candidates, DenoiseStep
from engine_pod.decoding.grammar.setup import GrammarSource
from engine_pod.decoding.logprobs import LogprobRecorder
from engine_pod.decoding.policies import StepContext
from engine_pod.decoding.policies.scheduled_threshold import ScheduledThresholdPolicy
from engine_pod.kinds.block_causal import grammar as grammar_hooks
from engine_pod.kinds.block_causal.batches import dense_forward, packed_forward
from engine_pod.kinds.block_causal.cycle_layout import (
    BlockCycle,
    BlockRow,
    lay_out,
    layout_regions,
    step_queries,
)
from engine_pod.kinds.block_causal.prefill_chunk import CycleChunks, after_forward, committed, keep_blocks
from engine_pod.kinds.block_causal.prefix_cache import BlockPrefixCache
from engine_pod.kinds.block_causal.warm_prefix import fill_prefix
from engine_pod.runner.contract import CycleOutput, CycleStats, PrefixCacheStats
from engine_pod.runner.model_interface import ServedModel
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput

# what the remasking names mean for a block-diffusion model: its reference rule, with or without threshold
BLOCK_THRESHOLDS = {"threshold": None, "scheduled_threshold": None, "low_confidence": float("inf")}
DEFAULT_POOL_TOKENS = 1 << 16
# a family whose reference generate caps the steps per block at the generation length (its record's
# steps_capped_by_length): ``steps = min(steps, gen_length // minimal_topk)`` (LLaDA2.0's; SDAR's keeps all)
MINIMAL_TOPK = 1  # that generate's default


def block_threshold(decoding: DecodingConfig) -> float:
    """The threshold of the reference rule that ``decoding.remasking`` names."""
    if decoding.remasking not in BLOCK_THRESHOLDS:
        raise DecodingConfigError(
            f"remasking {decoding.remasking!r} is not defined for block-diffusion models; "
            f"choose one of {sorted(BLOCK_THRESHOLDS)}"
        )
    fixed = BLOCK_THRESHOLDS[decoding.remasking]
    return decoding.threshold if fixed is None else fixed


@dataclass
class _BlockCausalCycle:
    """One cycle's state between its steps."""

    layout: BlockCycle
    heads: list[int]  # each row's fixed head in its block (the prompt's tail on the grid)
    forwards_before: list[int]
    hits: dict[str, int]  # tokens found in the prefix cache, per row entering the batch
    gather_rows: bool
    packed: bool
    steps: int  # the most steps a row's block takes
    recorder: LogprobRecorder | None
    logprobs: list[list | None] | None
    masked: torch.Tensor | None = None  # [R] masks left in each row's block, after the last read
    counts: list[int] = field(default_factory=list)  # the same, read
    stats: CycleStats = field(default_factory=CycleStats)
    grammar: object | None = None  # its constrained rows (decoding/grammar/rows.py; None: none)
    chunks: CycleChunks = field(default_factory=CycleChunks)


class BlockCausalStepper:
    """The block-causal kind's part of a block cycle (a ``Stepper`` of runner/cycle_driver.py)."""

    grid_aligned = True  # the scheduler puts blocks on the absolute grid
    staggers_refreshes = False  # an exact cache: nothing to refresh
    request_defaults = None  # the family adds no per-request settings

    def __init__(self, loaded: ServedModel, decoding: DecodingConfig, pool_tokens: int | None = None) -> None:
        self.loaded, self.decoding = loaded, decoding
        self.threshold = block_threshold(decoding)
        L = decoding.block_length
        pages = -(-(pool_tokens or DEFAULT_POOL_TOKENS) // L) + 1
        self.model = loaded.model
        self.pool = self.model.new_pool(pages, L, loaded.device)
        self.pool.buffers.reserve(layout_regions(pages * L, L))  # each cycle's lists, at fixed addresses
        self.exact_cache = decoding.cache != "none"
        self.mask_id = self.model.config.mask_token_id
        self.policy = ScheduledThresholdPolicy()
        self.states: dict[str, BlockRow] = {}
        shares = decoding.prefix_cache and decoding.uses_cache  # shared keys must never be recomputed
        self.prefix_cache = BlockPrefixCache(self.pool, L) if shares else None
        self.score_dtype = torch.promote_types(loaded.dtype, torch.float32)
        self.denoise = DenoiseStep(self.policy, self.score_dtype, self.mask_id)
        self.grammars = GrammarSource(loaded, decoding.logit_candidates)
        self.chunks_prefill = self.exact_cache  # final keys and values: a prompt computes a chunk at a time

    @property
    def shares_blocks(self) -> bool:
        return self.prefix_cache is not None

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        return None if self.prefix_cache is None else self.prefix_cache.stats

    def begin(self, cycle: SchedulerOutput) -> _BlockCausalCycle:
        """Released rows give their pages back; every row takes its place in the cache (its cached blocks
        where it enters the batch), its pages up to its block's end, and the cycle's layout (one copy)."""
        rows, L = cycle.rows, self.decoding.block_length
        released = set(cycle.released)
        for owner in [o for o in self.states if o in released]:  # oldest first: the pool's free order
            self._forget(owner)
        owners = cycle.request_ids
        entering = [
            owner not in self.states or self.states[owner].tokens != list(row.prefix_ids)
            for owner, row in zip(owners, rows)
        ]
        states = [self._state(owner, row) for owner, row in zip(owners, rows)]
        hits = self._share(states, entering) if self.prefix_cache is not None else {}
        counts = [row.params.logprobs for row in rows]
        asked = any(k is not None for k in counts)
        logprobs = [[None] * L if k is not None else None for k in counts] if asked else None
        layout = lay_out(
            states,
            self.pool,
            L,
            self.decoding.steps_per_block,
            self.mask_id,
            self.score_dtype,
            [row.params for row in rows],
        )
        grammar = grammar_hooks.constrained_rows(self, rows, states, layout.starts)
        return _BlockCausalCycle(
            layout,
            [len(state.tokens) % L for state in states],
            [state.forwards for state in states],
            hits,
            cycle.gather_rows,
            cycle.packed,
            grammar_hooks.most_steps(self, states, grammar),
            LogprobRecorder(counts, logprobs) if asked else None,
            logprobs,
            grammar=grammar,
            chunks=CycleChunks.of(states),
        )

    def most_steps(self, state: _BlockCausalCycle) -> int:
        return state.steps

    @torch.no_grad()
    def going_on(self, state: _BlockCausalCycle, step: int) -> bool:
        """Whether a block has masks left (the step's one read), within the cycle's steps."""
        if step >= state.steps:
            return False
        state.masked = (state.layout.blocks == self.mask_id).sum(1)
        state.counts = grammar_hooks.read_counts(state)
        return state.chunks.going_on(step, state.stats) or any(state.counts)

    @torch.no_grad()
    def step(self, state: _BlockCausalCycle, step: int) -> None:
        """One step of the rows with masks left (every row, where the cycle keeps them all)."""
        cycle, counts = state.layout, state.counts
        inputs = grammar_hooks.before_step(state, self.mask_id)
        live, rows = state.chunks.live(step, state.masked, counts, state.gather_rows)
        candidates = sum(counts[i] for i in live)
        queries = step_queries(cycle, live, rows, self.exact_cache, self.mask_id, candidates, state.packed)
        build = packed_forward if state.packed else dense_forward
        batch, select = build(queries, self.pool)
        state.chunks.count(step, cycle.rows, batch.tokens.numel(), any(counts), state.stats)
        hidden = self.model.forward_batch(batch, select)
        state.stats.computed_positions += batch.tokens.numel()
        state.stats.useful_positions += sum(w for w, i in zip(queries.widths, live) if cycle.rows[i].active)
        mask = queries.blocks == self.mask_id
        context = StepContext(
            step=step,
            steps_per_block=cycle.steps[rows],
            masks_at_block_start=mask.sum(1),
            masks_now=mask.sum(1),
            threshold=cycle.thresholds[rows],
            eps=0.0,
        )
        positions = batch.positions[select[0], select[1]]
        commit = self.denoise(
            hidden,
            Candidates.of(mask, rows, queries.candidates),
            queries.blocks,
            positions,
            step,
            cycle.sampling,
            context,
            state.recorder,
            None if inputs is None else inputs.step,
        )
        cycle.blocks[rows] = commit.blocks
        grammar_hooks.keep_report(state, inputs, commit)
        for i in live:
            cycle.rows[i].forwards += 1
            if self.exact_cache:
                cycle.rows[i].cached = after_forward(cycle.rows[i], cycle.starts[i])

    def finish(self, state: _BlockCausalCycle) -> CycleOutput:
        """Every row's block (its fixed head left out), its tokens extended to the block's end."""
        cycle = state.layout
        blocks = cycle.blocks.tolist()
        grammar_hooks.host_blocks(state, blocks)
        if any(self.mask_id in block for block in blocks):
            raise RuntimeError(f"a block kept masks after {state.steps} steps; this is a bug")
        if state.recorder is not None:
            state.recorder.finish()
        keep_blocks(cycle.rows, cycle.starts, blocks)
        steps = [row.forwards - before for row, before in zip(cycle.rows, state.forwards_before)]
        state.stats.forwards = max(steps)
        state.stats.cached_on_entry = state.hits
        heads, recorded = state.heads, state.logprobs
        return CycleOutput(
            blocks=committed(cycle.rows, blocks, heads),
            steps=steps,
            stats=state.stats,
            logprobs=None if recorded is None else committed(cycle.rows, recorded, heads),
        )

    def end(self, state: _BlockCausalCycle) -> None:
        """Nothing: the rows' pages are kept for their next cycle."""

    def _state(self, owner: str, row: CycleRow) -> BlockRow:
        prefix = list(row.prefix_ids)
        state = self.states.get(owner)
        if state is None or state.tokens != prefix:
            self._leave(owner)
            threshold = self.threshold if row.params.threshold is None else row.params.threshold
            state = self.states[owner] = BlockRow(owner, prefix, threshold=threshold)
        state.active, state.steps, state.chunk_end = row.active, self._steps(row), row.prefill_to
        return state

    def first_block_confidences(self, prompts: list[list[int]]) -> torch.Tensor:
        """The scorer's confidences over each prompt's first block, from its first forward (what a
        threshold calibration samples); their pages are given back."""
        rows = [BlockRow(f"calibration-{i}", list(p)) for i, p in enumerate(prompts)]
        try:
            L, steps = self.decoding.block_length, self.decoding.steps_per_block
            cycle = lay_out(rows, self.pool, L, steps, self.mask_id, self.score_dtype)
            every = list(range(len(rows)))
            index = torch.arange(len(rows), device=self.pool.device)
            batch, select = packed_forward(
                step_queries(cycle, every, index, self.exact_cache, self.mask_id), self.pool
            )
            with torch.no_grad():
                _, confidence = self.model.forward_batch(batch, select).map_logits(self.policy.scorer, (0,))
            return confidence
        finally:
            for row in rows:
                self.pool.release(row.owner)

    def warm_prefix(self, tokens: list[int]) -> int:
        """Compute ``tokens``' whole blocks into the prefix cache and pin them: the tokens newly pinned."""
        return fill_prefix(self, tokens)

    def _steps(self, row: CycleRow) -> int:
        """The row's steps per block: the engine's, capped as the family's reference caps them."""
        steps = self.decoding.steps_per_block
        if (max_tokens := row.params.max_tokens) is None or not self.loaded.family.steps_capped_by_length:
            return steps
        return max(1, min(steps, max_tokens // MINIMAL_TOPK))

    def forget(self) -> None:
        """Let go of every row and empty the prefix cache (a benchmark's warm-up leaves nothing behind)."""
        for owner in list(self.states):
            self._forget(owner)
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def _share(self, states: list[BlockRow], entering: list[bool]) -> dict[str, int]:
        """Rows entering the batch take their cached blocks (returned: tokens found, per entering row);
        every row's blocks before its active block go to the cache (rows already in the batch first)."""
        L, cache = self.decoding.block_length, self.prefix_cache
        hits = {}
        for state, new in sorted(zip(states, entering), key=lambda pair: pair[1]):
            if new:
                state.cached = hits[state.owner] = cache.attach(state.owner, state.tokens)
            start = state.block_start(L)
            self.pool.reserve(state.owner, start + L)
            cache.extend(state.owner, state.tokens, start)
        return hits

    def _leave(self, owner: str) -> None:
        self.pool.release(owner)
        if self.prefix_cache is not None:
            self.prefix_cache.detach(owner)

    def _forget(self, owner: str) -> None:
        if self.states.pop(owner, None) is not None:
            self._leave(owner)
