"""A block-diffusion cycle's layout over the exact, persistent KV cache, and each step's queries.

Blocks lie on the absolute grid of the block length (positions [bL, (b+1)L)), as the reference
``generate`` places them: a prompt that does not end on the grid shares its last block with the first
generated tokens, which stay fixed while the block's masks are denoised.

A row's first forward in a cycle takes its committed tokens not yet in the cache (the whole aligned
prompt at the first cycle, the block committed last cycle after that) together with the active block:
their keys and values are final and stay in the pool; the block's are rewritten at each step. Later
forwards take the active block alone. With ``exact_cache=False`` every forward recomputes the whole
context instead, as the reference does; both give the same tokens (tests/engine_pod/test_block_diffusion.py).
The stepper that runs these cycles is stepper.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dllm_contracts.request_params import GREEDY, RequestParams
from engine_pod.decoding.row_sampling import COLUMNS, RowSampling
from engine_pod.device_buffers import Floats
from engine_pod.kinds.block_causal.batches import StepQueries
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
    # > 0: a chunk row this cycle (prefill_chunk.py): its prompt's keys and values up to
    # here are computed, its last block standing in for the active block; nothing is decoded
    chunk_end: int = 0

    def block_start(self, block_length: int) -> int:
        if self.chunk_end:
            return self.chunk_end - block_length
        return len(self.tokens) // block_length * block_length


@dataclass
class BlockCycle:
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


def layout_regions(tokens: int, block_length: int) -> dict[str, int]:
    """A block cycle's regions in the pool's device buffers, for a pool of ``tokens`` positions: per row
    (as many rows as it holds blocks) a step's row offsets, varlen metadata and row extents (batches.py),
    the cycle's steps, thresholds, starts and sampling settings; then its blocks, context tokens and key
    slots."""
    rows = max(1, tokens // block_length)
    per_row = {"offsets": rows, "varlen_metadata": 3 * (rows + 1), "widths": rows, "ends": rows}
    per_row |= {"steps": rows, "thresholds": rows}
    per_row |= {"starts": rows, "sampling": rows * COLUMNS}
    return per_row | {"blocks": tokens, "context_tokens": tokens, "slots": tokens}


def lay_out(
    rows: list[BlockRow],
    pool: PagedKVPool,
    block_length: int,
    steps: int,
    mask_id: int,
    score_dtype: torch.dtype,
    sampling: list[RequestParams] | None = None,
) -> BlockCycle:
    """Reserve every row's pages up to its active block's end and lay out the blocks (fixed head, masks),
    every row's steps (``steps`` where it has none of its own), threshold and sampling settings: one copy."""
    L = block_length
    starts = [row.block_start(L) for row in rows]
    for row, start in zip(rows, starts):
        pool.reserve(row.owner, start + L)
    ends = [start + L for start in starts]
    slots = pool.host_slots([(row.owner, 0, end) for row, end in zip(rows, ends)])
    context_tokens = [token for row, start in zip(rows, starts) for token in row.tokens[:start]]
    heads = [row.tokens[start : start + L] for row, start in zip(rows, starts)]
    block_ids = [token for head in heads for token in head + [mask_id] * (L - len(head))]
    settings = RowSampling.host_columns(sampling or [GREEDY] * len(rows))
    sent = pool.buffers.send(  # the cycle's one copy to the device, into the pool's regions
        {
            "slots": slots,
            "context_tokens": context_tokens,
            "blocks": block_ids,
            "steps": [row.steps or steps for row in rows],
            "thresholds": Floats(row.threshold for row in rows),
            "starts": starts,
            "sampling": [value for row in settings or [] for value in row],
        }
    )
    on_device = None
    if settings is not None:
        on_device = RowSampling.from_device(sent["sampling"].view(len(rows), -1), sampling, score_dtype)
    return BlockCycle(
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


def step_queries(
    cycle: BlockCycle,
    live: list[int],
    index: torch.Tensor,
    exact_cache: bool,
    mask_id: int,
    candidates: int | None = None,
    packed: bool = True,
) -> StepQueries:
    """The live rows' queries (``index``: ``live`` on the device; ``candidates``: their masked positions
    where the host knows them): from their first uncached position (0 without the exact cache). Packed
    rows whose queries are their blocks are laid out on the device: no per-row views are made for them."""
    firsts = [cycle.rows[i].cached if exact_cache else 0 for i in live]
    starts = [cycle.starts[i] for i in live]
    per_row = not packed or firsts != starts
    return StepQueries(
        firsts,
        starts,
        [cycle.contexts[i][first:] for i, first in zip(live, firsts)] if per_row else [],
        [cycle.key_slots[i] for i in live] if per_row else [],
        cycle.blocks[index],
        cycle.blocks.shape[1],
        mask_id,
        candidates,
        cycle.starts_on_device[index],
        cycle.slots,
        cycle.slot_base[index],
    )


def live_rows(masked: torch.Tensor, counts: list[int], gather_rows: bool) -> tuple[list[int], torch.Tensor]:
    """The rows that step (those with masks left, or all of them), on the host and on the device (found
    there: rows without masks sort after the others, in order)."""
    if not gather_rows:
        return list(range(len(counts))), torch.arange(len(counts), device=masked.device)
    live = [i for i, count in enumerate(counts) if count]
    return live, torch.argsort((masked == 0).to(torch.int8), stable=True)[: len(live)]
