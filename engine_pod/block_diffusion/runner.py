"""Block cycles of a block-diffusion model over an exact, persistent KV cache.

Blocks lie on the absolute grid of the block length (positions [bL, (b+1)L)), as the reference
``generate`` places them: a prompt that does not end on the grid shares its last block with the first
generated tokens, which stay fixed while the block's masks are denoised.

A row's first forward in a cycle takes its committed tokens not yet in the cache (the whole aligned
prompt at the first cycle, the block committed last cycle after that) together with the active block:
their keys and values are final and stay in the pool; the block's are rewritten at each step. Later
forwards take the active block alone. With ``exact_cache=False`` every forward recomputes the whole
context instead, as the reference does; both give the same tokens (tests/engine_pod/test_block_diffusion.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine_pod.decoding.candidates import score_candidates
from engine_pod.decoding.policies import StepContext
from engine_pod.decoding.policies.scheduled_threshold import ScheduledThresholdPolicy
from engine_pod.models.block_transformer import BlockDiffusionTransformer, BlockForward
from engine_pod.models.paged_kv import PagedKVPool


@dataclass
class BlockRow:
    """One request's place in a block cycle."""

    owner: str  # its pages in the pool
    tokens: list[int]  # prompt and committed tokens, the active block's fixed head (prompt tail) included
    cached: int = 0  # leading tokens whose keys and values are final in the pool (a multiple of L)
    threshold: float = 0.95
    forwards: int = field(default=0, compare=False)  # forwards this row took part in

    def block_start(self, block_length: int) -> int:
        return len(self.tokens) // block_length * block_length


@dataclass
class _Step:
    rows: list[int]  # indices into the cycle's rows
    start: list[int]  # per row: the first query position
    blocks: torch.Tensor  # [R', L] the rows' active blocks


class BlockDiffusionRunner:
    """Runs block cycles for rows of one block-diffusion model, greedily, with one block length."""

    def __init__(
        self,
        model: BlockDiffusionTransformer,
        pool: PagedKVPool,
        block_length: int,
        steps: int,
        exact_cache: bool = True,
    ) -> None:
        self.model, self.pool = model, pool
        self.block_length, self.steps = block_length, steps
        self.exact_cache = exact_cache
        self.mask_id = model.config.mask_token_id
        self.policy = ScheduledThresholdPolicy()
        self.device = model.lm_head.weight.device
        self.score_dtype = torch.promote_types(model.lm_head.weight.dtype, torch.float32)
        self.sampling = None
        self.computed_positions = 0  # query positions pushed through the model in the last cycle

    @torch.no_grad()
    def run_cycle(self, rows: list[BlockRow], sampling=None, gather_rows: bool = True) -> list[list[int]]:
        """Complete every row's active block; returns each row's block (L tokens, its fixed head included)
        and leaves the rows' tokens extended to the block's end. ``sampling``: a RowSampling over the rows
        (None: all greedy); ``gather_rows=False`` keeps rows whose block is complete in every forward
        (static batching's cost)."""
        self.sampling = sampling
        self.computed_positions = 0
        L = self.block_length
        starts = [row.block_start(L) for row in rows]
        heads = [row.tokens[start:] for row, start in zip(rows, starts)]
        for row, start in zip(rows, starts):
            self.pool.reserve(row.owner, start + L)
        blocks = torch.tensor(
            [head + [self.mask_id] * (L - len(head)) for head in heads], dtype=torch.long, device=self.device
        )
        for step in range(self.steps):
            masked = (blocks == self.mask_id).any(1)
            if not bool(masked.any()):
                break
            live = (masked if gather_rows else torch.ones_like(masked)).nonzero(as_tuple=True)[0].tolist()
            first = [rows[i].cached if self.exact_cache else 0 for i in live]
            self._denoise(rows, starts, _Step(live, first, blocks[live]), step, blocks)
            if self.exact_cache:
                for i in live:
                    rows[i].cached = starts[i]
        if bool((blocks == self.mask_id).any()):
            raise RuntimeError(f"a block kept masks after {self.steps} steps; this is a bug")
        for row, start, block in zip(rows, starts, blocks.tolist()):
            row.tokens[start:] = block
        return blocks.tolist()

    @torch.no_grad()
    def first_step_confidences(self, rows: list[BlockRow]) -> torch.Tensor:
        """The scorer's confidence at every masked position of the rows' active blocks, from their first
        forward (what a threshold calibration samples); the rows are left as they were."""
        L = self.block_length
        starts = [row.block_start(L) for row in rows]
        for row, start in zip(rows, starts):
            self.pool.reserve(row.owner, start + L)
        heads = [row.tokens[start:] for row, start in zip(rows, starts)]
        blocks = torch.tensor(
            [head + [self.mask_id] * (L - len(head)) for head in heads], dtype=torch.long, device=self.device
        )
        step = _Step(list(range(len(rows))), [row.cached for row in rows], blocks)
        batch, select = self._batch(rows, starts, step)
        _, confidence = self.model.forward_blocks(batch, select).map_logits(self.policy.scorer)
        return confidence

    def _denoise(
        self, rows: list[BlockRow], starts: list[int], step: _Step, index: int, blocks: torch.Tensor
    ):
        batch, select = self._batch(rows, starts, step)
        hidden = self.model.forward_blocks(batch, select)
        self.computed_positions += int(batch.write_slots.ne(self.pool.scratch).sum())
        candidates = step.blocks == self.mask_id
        pick_r, pick_k = candidates.nonzero(as_tuple=True)
        rows_of = torch.tensor(step.rows, device=self.device)[pick_r]
        positions = batch.positions[select[0], select[1]]
        proposal, confidence = score_candidates(
            hidden, self.policy.scorer, self.sampling, rows_of, positions, index, self.score_dtype
        )
        scores = torch.full(step.blocks.shape, float("-inf"), dtype=confidence.dtype, device=self.device)
        scores[pick_r, pick_k] = confidence
        proposals = step.blocks.clone()
        proposals[pick_r, pick_k] = proposal
        thresholds = torch.tensor(
            [rows[i].threshold for i in step.rows], dtype=torch.float64, device=self.device
        )
        context = StepContext(
            step=index,
            steps_per_block=self.steps,
            masks_at_block_start=candidates.sum(1),
            masks_now=candidates.sum(1),
            threshold=thresholds,
            eps=0.0,
        )
        transfer = self.policy.select(scores, candidates, context)
        blocks[step.rows] = torch.where(transfer, proposals, step.blocks)
        for i in step.rows:
            rows[i].forwards += 1

    def _batch(self, rows: list[BlockRow], starts: list[int], step: _Step):
        """The padded forward of the step's rows and the (row, query) pairs whose masks need logits."""
        L, scratch = self.block_length, self.pool.scratch
        ends = [starts[i] + L for i in step.rows]
        widths = [end - first for end, first in zip(ends, step.start)]
        queries, keys = max(widths), max(ends)
        tokens = torch.zeros(len(step.rows), queries, dtype=torch.long, device=self.device)
        positions = torch.zeros_like(tokens)
        write = torch.full_like(tokens, scratch)
        key_slots = torch.full((len(step.rows), keys), scratch, dtype=torch.long, device=self.device)
        for r, (i, first, end) in enumerate(zip(step.rows, step.start, ends)):
            width, start = end - first, starts[i]
            committed = torch.tensor(rows[i].tokens[first:start], dtype=torch.long, device=self.device)
            tokens[r, :width] = torch.cat([committed, step.blocks[r]])
            positions[r, :width] = torch.arange(first, end, device=self.device)
            write[r, :width] = self.pool.slots(rows[i].owner, first, end)
            key_slots[r, :end] = self.pool.slots(rows[i].owner, 0, end)
        mask = self._mask(positions, widths, ends, keys)
        pick_r, pick_k = (step.blocks == self.mask_id).nonzero(as_tuple=True)
        offsets = torch.tensor(widths, device=self.device) - L
        return BlockForward(tokens, positions, write, key_slots, mask, self.pool), (
            pick_r,
            offsets[pick_r] + pick_k,
        )

    def _mask(self, positions: torch.Tensor, widths: list[int], ends: list[int], keys: int) -> torch.Tensor:
        """Block-causal: a query sees every key of its own block and of the blocks before it."""
        L = self.block_length
        key_pos = torch.arange(keys, device=self.device)
        valid_query = (
            torch.arange(positions.shape[1], device=self.device)[None]
            < torch.tensor(widths, device=self.device)[:, None]
        )
        valid_key = key_pos[None] < torch.tensor(ends, device=self.device)[:, None]
        mask = (key_pos[None, None] // L <= positions[:, :, None] // L) & valid_key[:, None]
        mask &= valid_query[:, :, None]
        mask[:, :, 0] |= ~valid_query  # a padded query attends one real key: no all-masked row, no NaN
        return mask
