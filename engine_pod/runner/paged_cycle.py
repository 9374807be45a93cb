"""The engine's runner for block-diffusion models: the scheduler's cycle in, committed tokens out.

Keeps each request's place in the exact KV cache across block cycles, keyed by the row's owner: a row
whose committed tokens are the ones cached last cycle reuses them; a request the scheduler names as
released (finished, cancelled, preempted) gives its pages back, and one that comes back recomputes its
cache from its committed tokens at its next cycle. The pool holds the token budget's pages.
"""

from __future__ import annotations

import torch

from engine_pod.block_diffusion.prefix_cache import BlockPrefixCache, PrefixCacheStats
from engine_pod.block_diffusion.stepper import BlockDiffusionStepper, BlockRow
from engine_pod.decoding.config import DecodingConfig, DecodingConfigError
from engine_pod.loading.loader import LoadedModel
from engine_pod.runner.contract import CycleOutput, CycleStats
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


class PagedCacheRunner:
    """The Runner contract for a model with an exact, persistent cache."""

    grid_aligned = True  # the scheduler puts blocks on the absolute grid
    canvas_sampler = None  # no entropy-bound sampler

    def __init__(self, loaded: LoadedModel, decoding: DecodingConfig, pool_tokens: int | None = None) -> None:
        self.loaded, self.decoding = loaded, decoding
        self.threshold = block_threshold(decoding)
        L = decoding.block_length
        pages = -(-(pool_tokens or DEFAULT_POOL_TOKENS) // L) + 1
        self.pool = loaded.model.new_pool(pages, L, loaded.device)
        self.stepper = BlockDiffusionStepper(
            loaded.model, self.pool, L, decoding.steps_per_block, exact_cache=decoding.cache != "none"
        )
        self.states: dict[str, BlockRow] = {}
        shares = decoding.prefix_cache and decoding.uses_cache  # shared keys must never be recomputed
        self.prefix_cache = BlockPrefixCache(self.pool, L) if shares else None
        self.score_dtype = torch.promote_types(loaded.dtype, torch.float32)

    @property
    def shares_blocks(self) -> bool:
        return self.prefix_cache is not None

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        return None if self.prefix_cache is None else self.prefix_cache.stats

    def run(self, cycle: SchedulerOutput) -> CycleOutput:
        rows, gather_rows, packed = cycle.rows, cycle.gather_rows, cycle.packed
        if not rows:
            raise ValueError("a block cycle needs at least one row")
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
        heads = [len(state.tokens) % self.decoding.block_length for state in states]
        forwards_before = [state.forwards for state in states]
        sampling = [row.sampling for row in rows]
        counts = [row.logprobs for row in rows]
        blocks = self.stepper.run_cycle(states, sampling, gather_rows, packed, counts)
        steps = [state.forwards - before for state, before in zip(states, forwards_before)]
        stats = CycleStats(
            forwards=max(steps),
            computed_positions=self.stepper.computed_positions,
            useful_positions=self.stepper.useful_positions,
            cached_on_entry=hits,
        )
        recorded = self.stepper.logprobs
        return CycleOutput(
            blocks=[block[head:] for block, head in zip(blocks, heads)],
            steps=steps,
            stats=stats,
            logprobs=None
            if recorded is None
            else [r if r is None else r[h:] for r, h in zip(recorded, heads)],
        )

    def _state(self, owner: str, row: CycleRow) -> BlockRow:
        prefix = list(row.prefix_ids)
        state = self.states.get(owner)
        if state is None or state.tokens != prefix:
            self._leave(owner)
            threshold = self.threshold if row.threshold is None else row.threshold
            state = self.states[owner] = BlockRow(owner, prefix, threshold=threshold)
        state.active = row.active
        state.steps = self._steps(row)
        return state

    def first_block_confidences(self, prompts: list[list[int]]) -> torch.Tensor:
        """The scorer's confidences over each prompt's first block, from its first forward (what a
        threshold calibration samples); their pages are given back."""
        rows = [BlockRow(f"calibration-{i}", list(p)) for i, p in enumerate(prompts)]
        try:
            return self.stepper.first_step_confidences(rows)
        finally:
            for row in rows:
                self.pool.release(row.owner)

    def _steps(self, row: CycleRow) -> int:
        """The row's steps per block: the engine's, capped as the family's reference caps them."""
        steps = self.decoding.steps_per_block
        if row.max_tokens is None or not self.loaded.family.steps_capped_by_length:
            return steps
        return max(1, min(steps, row.max_tokens // MINIMAL_TOPK))

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
