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
import torch.nn.functional as F

from engine_pod.block_diffusion.batches import StepQueries, dense_forward, packed_forward
from engine_pod.decoding.denoise_step import Candidates, DenoiseStep
from engine_pod.decoding.logprobs import LogprobRecorder
from engine_pod.decoding.policies import StepContext
from engine_pod.decoding.policies.scheduled_threshold import ScheduledThresholdPolicy
from engine_pod.decoding.row_sampling import RowSampling
from engine_pod.decoding.sampling_params import SamplingParams
from engine_pod.host_bundle import Floats, send_named
from engine_pod.models.block_transformer import BlockDiffusionTransformer
from engine_pod.models.paged_kv import PagedKVPool


@dataclass
class BlockRow:
    """One request's place in a block cycle."""

    owner: str  # its pages in the pool
    tokens: list[int]  # prompt and committed tokens, the active block's fixed head (prompt tail) included
    cached: int = 0  # leading tokens whose keys and values are final in the pool (a multiple of L)
    threshold: float = 0.95
    active: bool = True  # False: a finished row static batching keeps computing, never committed
    steps: int | None = None  # denoising steps of this row's blocks (None: the runner's)
    forwards: int = field(default=0, compare=False)  # forwards this row took part in

    def block_start(self, block_length: int) -> int:
        return len(self.tokens) // block_length * block_length


@dataclass
class _Cycle:
    """What a cycle's forwards share: each row's block start, key slots and committed tokens."""

    rows: list[BlockRow]
    starts: list[int]
    key_slots: list[torch.Tensor]  # per row: pool slots of positions [0, start + L)
    contexts: list[torch.Tensor]  # per row: its tokens before the active block, on the device
    blocks: torch.Tensor  # [R, L] the active blocks, denoised in place
    steps: torch.Tensor  # [R] each row's denoising steps: its block completes within them
    thresholds: torch.Tensor  # [R] each row's confidence threshold (float64)
    starts_on_device: torch.Tensor  # [R] starts, on the device
    sampling: RowSampling | None  # the rows' sampling settings (None: every row is greedy)
    slots: torch.Tensor  # every row's key slots [0, end), one row after another
    slot_base: torch.Tensor  # [R] where each row's slots start in ``slots``


class BlockDiffusionStepper:
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
        self.denoise = DenoiseStep(self.policy, self.score_dtype, self.mask_id)
        self.sampling = None
        self.computed_positions = 0  # query positions pushed through the model in the last cycle
        self.useful_positions = 0  # of those, the active rows' (no padding, no finished rows)
        self.recorder: LogprobRecorder | None = None  # the cycle's log probabilities, read at its end
        # per row asking, per block position: its committed token's log probability (decoding/logprobs.py)
        self.logprobs: list[list | None] | None = None

    @torch.no_grad()
    def run_cycle(
        self,
        rows: list[BlockRow],
        sampling=None,
        gather_rows: bool = True,
        packed: bool = True,
        logprobs: list[int | None] | None = None,
    ) -> list[list[int]]:
        """Complete every row's active block; returns each row's block (L tokens, its fixed head included)
        and leaves the rows' tokens extended to the block's end. ``sampling``: each row's settings (None:
        greedy; sent with the cycle's layout); ``gather_rows=False`` keeps rows whose block is complete in every forward
        (static batching's cost); ``packed``: forwards without padding (else a padded box); ``logprobs``:
        per row, how many alternatives to record with each committed token (None: none), in
        ``self.logprobs`` after the cycle."""
        self.computed_positions = self.useful_positions = 0
        asked = logprobs is not None and any(k is not None for k in logprobs)
        L = self.block_length
        self.logprobs = [[None] * L if k is not None else None for k in logprobs] if asked else None
        self.recorder = LogprobRecorder(logprobs, self.logprobs) if asked else None
        cycle = self._cycle(rows, sampling)
        self.sampling = cycle.sampling
        build = packed_forward if packed else dense_forward
        steps = max(row.steps or self.steps for row in rows)
        for step in range(steps):
            masked = (cycle.blocks == self.mask_id).sum(1)
            counts = masked.tolist()  # the step's one read from the device
            if not any(counts):
                break
            live, index = self._live(masked, counts, gather_rows)
            self._denoise(cycle, live, index, sum(counts[i] for i in live), step, build, packed)
            if self.exact_cache:
                for i in live:
                    rows[i].cached = cycle.starts[i]
        if bool((cycle.blocks == self.mask_id).any()):
            raise RuntimeError(f"a block kept masks after {steps} steps; this is a bug")
        blocks = cycle.blocks.tolist()
        if self.recorder is not None:
            self.recorder.finish()
        for row, start, block in zip(rows, cycle.starts, blocks):
            row.tokens[start:] = block
        return blocks

    @torch.no_grad()
    def first_step_confidences(self, rows: list[BlockRow]) -> torch.Tensor:
        """The scorer's confidence at every masked position of the rows' active blocks, from their first
        forward (what a threshold calibration samples); the rows are left as they were."""
        cycle = self._cycle(rows)
        every = list(range(len(rows)))
        batch, select = packed_forward(
            self._queries(cycle, every, torch.arange(len(rows), device=self.device)), self.pool
        )
        _, confidence = self.model.forward_batch(batch, select).map_logits(self.policy.scorer)
        return confidence

    def _cycle(self, rows: list[BlockRow], sampling: list[SamplingParams | None] | None = None) -> _Cycle:
        """Reserve every row's pages up to its active block's end and lay out the blocks (fixed head, masks)."""
        L = self.block_length
        starts = [row.block_start(L) for row in rows]
        for row, start in zip(rows, starts):
            self.pool.reserve(row.owner, start + L)
        ends = [start + L for start in starts]
        slots = self.pool.host_slots([(row.owner, 0, end) for row, end in zip(rows, ends)])
        context_tokens = [token for row, start in zip(rows, starts) for token in row.tokens[:start]]
        heads = [row.tokens[start:] for row, start in zip(rows, starts)]
        block_ids = [token for head in heads for token in head + [self.mask_id] * (L - len(head))]
        settings = RowSampling.host_columns(sampling or [None] * len(rows))
        sent = send_named(  # the cycle's one copy to the device
            {
                "slots": slots,
                "context_tokens": context_tokens,
                "blocks": block_ids,
                "steps": [row.steps or self.steps for row in rows],
                "thresholds": Floats(row.threshold for row in rows),
                "starts": starts,
                "sampling": [value for row in settings or [] for value in row],
            },
            self.device,
        )
        on_device = None
        if settings is not None:
            on_device = RowSampling.from_device(
                sent["sampling"].view(len(rows), -1), sampling, self.score_dtype
            )
        return _Cycle(
            rows,
            starts,
            list(sent["slots"].split(ends)),
            list(sent["context_tokens"].split(starts)),
            sent["blocks"].view(len(rows), L),
            sent["steps"],
            sent["thresholds"],
            sent["starts"],
            on_device,
            sent["slots"],
            F.pad((sent["starts"] + L).cumsum(0), (1, 0))[:-1],
        )

    def _queries(
        self,
        cycle: _Cycle,
        live: list[int],
        index: torch.Tensor,
        candidates: int | None = None,
        packed: bool = True,
    ) -> StepQueries:
        """The live rows' queries (``index``: ``live`` on the device; ``candidates``: their masked positions
        where the host knows them): from their first uncached position (0 without the exact cache). Packed
        rows whose queries are their blocks are laid out on the device: no per-row views are made for them."""
        firsts = [cycle.rows[i].cached if self.exact_cache else 0 for i in live]
        starts = [cycle.starts[i] for i in live]
        per_row = not packed or firsts != starts
        return StepQueries(
            firsts,
            starts,
            [cycle.contexts[i][first:] for i, first in zip(live, firsts)] if per_row else [],
            [cycle.key_slots[i] for i in live] if per_row else [],
            cycle.blocks[index],
            self.block_length,
            self.mask_id,
            candidates,
            cycle.starts_on_device[index],
            cycle.slots,
            cycle.slot_base[index],
        )

    @staticmethod
    def _live(masked: torch.Tensor, counts: list[int], gather_rows: bool) -> tuple[list[int], torch.Tensor]:
        """The rows that step (those with masks left, or all of them), on the host and on the device (found
        there: rows without masks sort after the others, in order)."""
        if not gather_rows:
            return list(range(len(counts))), torch.arange(len(counts), device=masked.device)
        live = [i for i, count in enumerate(counts) if count]
        return live, torch.argsort((masked == 0).to(torch.int8), stable=True)[: len(live)]

    def _denoise(
        self,
        cycle: _Cycle,
        live: list[int],
        rows: torch.Tensor,
        candidates: int,
        index: int,
        build,
        packed: bool,
    ) -> None:
        """One step of the ``live`` rows (``rows``: the same on the device; ``candidates``: their masked
        positions, counted on the host)."""
        queries = self._queries(cycle, live, rows, candidates, packed)
        batch, select = build(queries, self.pool)
        hidden = self.model.forward_batch(batch, select)
        self.computed_positions += batch.tokens.numel()
        self.useful_positions += sum(w for w, i in zip(queries.widths, live) if cycle.rows[i].active)
        mask = queries.blocks == self.mask_id
        candidates = Candidates.of(mask, rows, queries.candidates)
        positions = batch.positions[select[0], select[1]]
        context = StepContext(
            step=index,
            steps_per_block=cycle.steps[rows],
            masks_at_block_start=mask.sum(1),
            masks_now=mask.sum(1),
            threshold=cycle.thresholds[rows],
            eps=0.0,
        )
        commit = self.denoise(
            hidden, candidates, queries.blocks, positions, index, self.sampling, context, self.recorder
        )
        cycle.blocks[rows] = commit.blocks
        for i in live:
            cycle.rows[i].forwards += 1
