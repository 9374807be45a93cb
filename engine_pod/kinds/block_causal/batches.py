"""A block-diffusion step's forward inputs, dense (rows padded to a box) or packed (no padding).

Each row of a step contributes its queries: committed tokens not yet cached (positions ``[first,
start)``) and its active block (``[start, end)``). Both builders return the forward and which of its
query positions need logits (the block's masked ones, row by row in the step's order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine_pod.models.attention_backends import varlen_rows
from engine_pod.models.attention_rules import Masking
from engine_pod.models.forward_batch import ForwardBatch, KeyLayout, PoolSlots
from engine_pod.models.paged_kv import PagedKVPool
from engine_pod.models.ragged import Box, RaggedAttention, RowSpans, VarlenBatch, varlen_on_device

Selection = tuple[torch.Tensor, torch.Tensor]  # (row of the forward's tokens, query index in it)


@dataclass
class StepQueries:
    """The step's rows (in the step's order) and their queries."""

    firsts: list[int]  # per row: first query position
    starts: list[int]  # per row: its active block's start
    committed: list[torch.Tensor]  # per row: tokens [first, start), on the device
    key_slots: list[torch.Tensor]  # per row: pool slots of positions [0, start + L)
    blocks: torch.Tensor  # [R, L] active blocks
    block_length: int
    mask_id: int
    candidates: int | None = None  # masked positions in the blocks, where the host knows how many
    starts_on_device: torch.Tensor | None = None  # [R] starts, on the device
    slots: torch.Tensor | None = None  # the cycle's key slots, every row's [0, end) one after another
    slot_base: torch.Tensor | None = None  # [R] where each row's key slots start in ``slots``

    @property
    def blocks_only(self) -> bool:
        """Whether every row's queries are its active block (every step of a cycle but its first), with
        what the device needs to lay them out on its own."""
        on_device = self.starts_on_device is not None and self.slots is not None
        return on_device and all(first == start for first, start in zip(self.firsts, self.starts))

    @property
    def widths(self) -> list[int]:
        L = self.block_length
        return [start + L - first for first, start in zip(self.firsts, self.starts)]

    def masked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, index in its block) of every masked position, row-major."""
        masked = self.blocks == self.mask_id
        if self.candidates is None:
            return masked.nonzero(as_tuple=True)
        return torch.nonzero_static(masked, size=self.candidates).unbind(1)


def block_causal(queries: torch.Tensor, keys: torch.Tensor, block_length: int) -> torch.Tensor:
    """[..., Q, K] from query positions [..., Q] and key positions [K]: a query at position p may attend
    the key at position j iff j's block is p's block or an earlier one."""
    return keys // block_length <= queries[..., None] // block_length


def dense_forward(step: StepQueries, pool: PagedKVPool) -> tuple[ForwardBatch, Selection]:
    """Rows padded to the widest row's queries and keys; padded queries write the scratch slot."""
    L, device = step.block_length, step.blocks.device
    widths = step.widths
    ends = [start + L for start in step.starts]
    rows, queries, keys = len(widths), max(widths), max(ends)
    tokens = torch.zeros(rows, queries, dtype=torch.long, device=device)
    positions = torch.zeros_like(tokens)
    write = torch.full_like(tokens, pool.scratch)
    key_slots = torch.full((rows, keys), pool.scratch, dtype=torch.long, device=device)
    for r, (first, end, width) in enumerate(zip(step.firsts, ends, widths)):
        tokens[r, :width] = torch.cat([step.committed[r], step.blocks[r]])
        positions[r, :width] = torch.arange(first, end, device=device)
        write[r, :width] = step.key_slots[r][first:]
        key_slots[r, :end] = step.key_slots[r]
    widths_on_device, ends_on_device = _row_extents(step, widths, ends, pool)
    mask = _dense_mask(positions, widths_on_device, ends_on_device, keys, L)
    pick_r, pick_k = step.masked()
    offsets = widths_on_device - L
    plan = RaggedAttention.over_box(Box(rows, queries, keys, mask), device)
    layout = KeyLayout(plan, PoolSlots(key_slots.flatten(), pool.gather_scratch))
    forward = ForwardBatch(tokens, positions, {None: layout}, pool, write.flatten())
    return forward, (pick_r, offsets[pick_r] + pick_k)


def _row_extents(
    step: StepQueries, widths: list[int], ends: list[int], pool: PagedKVPool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's query count and key count on the device: from the starts already there when every row's
    queries are its block (every step but a cycle's first), else sent (one copy, the pool's regions)."""
    L, device = step.block_length, step.blocks.device
    if step.starts_on_device is not None and all(width == L for width in widths):
        return torch.full((len(widths),), L, device=device), step.starts_on_device + L
    sent = pool.buffers.send({"widths": widths, "ends": ends})
    return sent["widths"], sent["ends"]


def _dense_mask(
    positions: torch.Tensor, widths: torch.Tensor, ends: torch.Tensor, keys: int, L: int
) -> torch.Tensor:
    """Block-causal, padded keys never attended; a padded query attends one real key (no NaN)."""
    device = positions.device
    key_pos = torch.arange(keys, device=device)
    valid_query = torch.arange(positions.shape[1], device=device)[None] < widths[:, None]
    valid_key = key_pos[None] < ends[:, None]
    mask = block_causal(positions, key_pos, L) & valid_key[:, None]
    mask &= valid_query[:, :, None]
    mask[:, :, 0] |= ~valid_query
    return mask


def packed_forward(step: StepQueries, pool: PagedKVPool) -> tuple[ForwardBatch, Selection]:
    """Rows one after another, those of one (end, width) adjacent, and their keys in the same order: the
    plan attends each row over exactly its keys, one call per layer. Only a row whose queries reach back
    before its active block needs a mask."""
    L, device = step.block_length, step.blocks.device
    widths = step.widths
    order = sorted(range(len(widths)), key=lambda r: (-step.starts[r], -widths[r]))
    ends = [start + L for start in step.starts]
    q_start, k_start = [0] * len(widths), [0] * len(widths)
    queries = keys = 0
    for r in order:
        q_start[r], k_start[r] = queries, keys
        queries, keys = queries + widths[r], keys + ends[r]
    plan = RaggedAttention(RowSpans(q_start, widths, k_start, ends), device, Masking(block=L))
    if step.blocks_only:  # latest start first, found on the device
        on_device = torch.argsort(-step.starts_on_device, stable=True)
        offsets = _blocks_planned(step, plan, keys, on_device)
        laid_out = _blocks_laid_out(step, keys, on_device)
    else:
        offsets = _rows_planned(step, plan, keys, pool)
        laid_out = _rows_laid_out(step, order, ends)
    tokens, positions, write, key_slots = laid_out
    layout = KeyLayout(plan, PoolSlots(key_slots, pool.gather_scratch))
    forward = ForwardBatch(tokens, positions, {None: layout}, pool, write[0])
    pick_r, pick_k = step.masked()
    return forward, (torch.zeros_like(pick_r), offsets[pick_r] + pick_k)


def _blocks_laid_out(step: StepQueries, keys: int, order: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(tokens, positions, write slots, key slots) of rows whose queries are their blocks, in ``order`` (on
    the device), as batch operations (no work per row)."""
    L, device = step.block_length, step.blocks.device
    starts, base = step.starts_on_device[order], step.slot_base[order]
    columns = torch.arange(L, device=device)
    write = step.slots[(base + starts)[:, None] + columns]
    ends = starts + L
    shift = base - F.pad(ends.cumsum(0), (1, 0))[:-1]  # a row's slots in ``slots`` less its place in the keys
    places = torch.repeat_interleave(shift, ends, output_size=keys) + torch.arange(keys, device=device)
    positions = starts[:, None] + columns
    return (
        step.blocks[order].reshape(1, -1),
        positions.reshape(1, -1),
        write.reshape(1, -1),
        step.slots[places],
    )


def _rows_laid_out(step: StepQueries, order: list[int], ends: list[int]) -> tuple[torch.Tensor, ...]:
    """(tokens, positions, write slots, key slots) row by row, where rows reach back before their blocks
    (a cycle's first step)."""
    L, device = step.block_length, step.blocks.device
    tokens, positions, write, key_slots = [], [], [], []
    for r in order:
        first, end = step.firsts[r], ends[r]
        tokens.append(torch.cat([step.committed[r], step.blocks[r]]) if end - first > L else step.blocks[r])
        positions.append(torch.arange(first, end, device=device))
        write.append(step.key_slots[r][first:])
        key_slots.append(step.key_slots[r])
    return torch.cat(tokens)[None], torch.cat(positions)[None], torch.cat(write)[None], torch.cat(key_slots)


def _blocks_planned(step: StepQueries, plan: RaggedAttention, keys: int, order: torch.Tensor) -> torch.Tensor:
    """[R] where each row's active block starts among the packed queries, rows whose queries are their
    blocks packed in ``order``; the plan's varlen batch derived on the device beside it (no copy)."""
    L, device = step.block_length, step.blocks.device
    offsets = torch.empty_like(order)
    offsets[order] = torch.arange(0, L * order.shape[0], L, device=device)
    k_len = step.starts_on_device[order] + L
    k_start = F.pad(k_len.cumsum(0), (1, 0))[:-1]
    plan.settle_varlen(varlen_on_device(torch.full_like(k_len, L), k_start, k_len, plan.spans, keys))
    return offsets


def _rows_planned(step: StepQueries, plan: RaggedAttention, keys: int, pool: PagedKVPool) -> torch.Tensor:
    """[R] where each row's active block starts among the packed queries, rows reaching back before their
    blocks (a cycle's first step): sent with the plan's cut sequences, in one copy (the pool's regions)."""
    L, spans = step.block_length, plan.spans
    offsets = [spans.q_start[r] + spans.q_len[r] - L for r in range(len(spans.q_len))]
    host = varlen_rows(plan, keys)
    if host is None:
        plan.settle_varlen(None)
        return pool.buffers.send({"offsets": offsets})["offsets"]
    first, last, max_q, max_k, metadata = host
    sent = pool.buffers.send({"offsets": offsets, "varlen_metadata": [v for row in metadata for v in row]})
    varlen = sent["varlen_metadata"].view(3, -1).to(torch.int32)
    plan.settle_varlen(VarlenBatch(first, last, max_q, max_k, varlen))
    return sent["offsets"]
