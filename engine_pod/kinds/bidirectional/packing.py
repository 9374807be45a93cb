"""From the dense box (the runner's bookkeeping) to a packed forward batch (models/forward_batch.py):
only the positions that exist, rows one after another, each attending over its own keys in one call per
layer, the last layer computing only the positions whose logits are needed.

A refresh forward computes each row's attended positions (prompt, committed blocks, active block, and
the suffix where attention sees it; a hidden suffix is neither a key nor read, so it is skipped). A
window forward computes the window positions that exist and writes their keys at their rows' cache
positions. The box columns map to places in the cycle's dual cache through ``slot_of``
(cycle_cache.py: a refresh's packed positions are those places).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.kinds.bidirectional.cycle_box import CycleBox
from engine_pod.kinds.bidirectional.cycle_cache import CycleCache
from engine_pod.models.forward_batch import ForwardBatch, KeyLayout, OwnKeys, PoolRange
from engine_pod.models.ragged import RaggedAttention, RowSpans, VarlenBatch, starts_of, varlen_on_device


@dataclass(frozen=True)
class PackedInputs:
    batch: ForwardBatch  # tokens and positions [1, N]
    select: torch.Tensor  # [n] packed positions whose logits are needed, in the caller's order

    @property
    def computed(self) -> int:
        return self.batch.tokens.shape[1]


def refresh_inputs(
    box: CycleBox,
    index: torch.Tensor | None,
    cache: CycleCache | None,
    pick_r: torch.Tensor,
    source: torch.Tensor,
    members: list[int],
    picked: list[int],
    picked_on_device: torch.Tensor,
) -> PackedInputs:
    """A refresh over box rows ``index`` (None: all; ``members`` the same on the host);
    ``(pick_r, source)`` the (row, column) pairs whose logits are needed, ``picked`` how many per row (and
    the same on the device). Lengths come from the host's record of the rows: the layout is one copy to the
    device, no read, and the attention plans' varlen batches are derived from it there."""
    take = (lambda t: t) if index is None else (lambda t: t[index])
    layout = packed_layout(box, index, members)
    spans, total, row_start, row_len = layout.spans, layout.total, layout.row_start, layout.row_len
    order_on_device, rows, columns = layout.order, layout.rows, layout.columns
    write = None
    if cache is not None:
        layout.keep_in(cache)
        if cache.pool is not None:  # else head-sparse: nothing goes to the pool
            write = cache.slots(torch.arange(total, device=rows.device))
    in_order = row_len[order_on_device]
    every = varlen_on_device(in_order, row_start[order_on_device], in_order, spans, total)
    final = _final(spans, picked, picked_on_device, row_start, row_len, total)
    tokens, positions = take(box.tokens)[rows, columns], take(box.position_ids)[rows, columns]
    batch = _batch(tokens, positions, spans, final, every, OwnKeys(), cache, write)
    return PackedInputs(batch, layout.slot_of[pick_r, source])


@dataclass(frozen=True)
class PackedLayout:
    """Box rows packed one after another (longest first, rows of a length adjacent and in row order):
    each row's span, on the host and (``order``, ``row_start``, ``row_len``) on the device, each packed
    position's box (row, column) and the map ``slot_of`` [R, W + 1] from box columns to packed
    places (the total where a column is not packed). A dual cache keeps its places in this order."""

    spans: RowSpans
    total: int
    order: torch.Tensor
    row_start: torch.Tensor
    row_len: torch.Tensor
    rows: torch.Tensor
    columns: torch.Tensor
    slot_of: torch.Tensor

    def keep_in(self, cache: CycleCache) -> None:
        """Reserve ``cache``'s run for these places and record where each row's are."""
        cache.reserve(self.total)
        spans = self.spans
        cache.set_packed_layout(self.slot_of, spans.k_start, spans.k_len, self.row_start, self.row_len)


def packed_layout(box: CycleBox, index: torch.Tensor | None, members: list[int]) -> PackedLayout:
    """Box rows ``index`` (None: all; ``members`` the same on the host) packed over the positions
    attention sees, from the host's record of their lengths: one copy to the device, no read."""
    keep = box.key_mask if index is None else box.key_mask[index]
    lengths = [box.host.key_lengths[r] for r in members]
    order = sorted(range(len(members)), key=lambda i: -lengths[i])
    spans = _spans_in_order(lengths, order)
    sent = torch.tensor(order + spans.k_start + lengths).to(keep.device)  # the layout's one copy
    order_on_device, row_start, row_len = sent.view(3, -1).unbind(0)
    total = sum(lengths)
    rows, columns, slot_of = _pack(keep, order_on_device, box.width + 1, total)
    return PackedLayout(spans, total, order_on_device, row_start, row_len, rows, columns, slot_of)


def _final(
    spans: RowSpans,
    picked: list[int],
    picked_on_device: torch.Tensor,
    k_start: torch.Tensor | None,
    k_len: torch.Tensor | None,
    keys: int,
) -> tuple[RowSpans, VarlenBatch | None]:
    """The last layer's spans (each row's picked positions, consecutive in row order, over its keys as
    before) and,
    where the rows' keys are on the device (``k_start``, ``k_len`` [R], in row order), their varlen batch."""
    spans = RowSpans(starts_of(picked), list(picked), spans.k_start, spans.k_len)
    if k_start is None or k_len is None:
        return spans, None
    return spans, varlen_on_device(picked_on_device, k_start, k_len, spans, keys)


def _pack(
    keep: torch.Tensor, order: torch.Tensor, map_width: int, total: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The positions where ``keep`` [R, C] is True, packed row by row in ``order``: each packed
    position's (row, column), and the map [R, map_width] from (row, column) to packed position (the
    packed total where a column is not packed). ``total``: how many are True, where the host knows."""
    ordered = keep[order]
    if total is None:
        sorted_rows, columns = ordered.nonzero(as_tuple=True)
    else:
        sorted_rows, columns = torch.nonzero_static(ordered, size=total).unbind(1)
    rows = order[sorted_rows]
    total = rows.shape[0]
    packed_at = torch.full((keep.shape[0], map_width), total, dtype=torch.long, device=keep.device)
    packed_at[rows, columns] = torch.arange(total, device=keep.device)
    return rows, columns, packed_at


def _starts_in(order: list[int], lengths: list[int]) -> list[int]:
    """Where each row starts when the rows are packed in ``order``."""
    starts = [0] * len(lengths)
    for row, start in zip(order, starts_of([lengths[r] for r in order])):
        starts[row] = start
    return starts


def _spans_in_order(lengths: list[int], order: list[int]) -> RowSpans:
    """Each row's span when the rows are packed in ``order`` (a refresh: queries and keys alike)."""
    starts = _starts_in(order, lengths)
    return RowSpans(starts, lengths, starts, lengths)


def _batch(
    tokens: torch.Tensor,
    positions: torch.Tensor,
    spans: RowSpans,
    final: tuple[RowSpans, VarlenBatch | None],
    every: VarlenBatch | None,
    source: OwnKeys | PoolRange,
    cache: CycleCache | None,
    write: torch.Tensor | None,
) -> ForwardBatch:
    """The packed forward batch: every layer's plan (``every``: its varlen batch, where derived on the
    device) and the last layer's over the picked positions (``final``: their spans and varlen batch; picks
    come from a row-major nonzero, so they are grouped by row in order), both reading keys from ``source``."""
    device = tokens.device
    layout = KeyLayout(RaggedAttention(spans, device, varlen=every), source)
    last = KeyLayout(RaggedAttention(final[0], device, varlen=final[1]), source)
    pool = None if cache is None else cache.pool
    return ForwardBatch(tokens[None], positions[None], {None: layout}, pool, write, last)


def window_inputs(
    box: CycleBox,
    cache: CycleCache,
    index: torch.Tensor,
    slots: torch.Tensor,
    pick_r: torch.Tensor,
    source: torch.Tensor,
    members: list[int],
    picked: list[int],
    picked_on_device: torch.Tensor,
    lengths: list[int] | None = None,
    lengths_on_device: torch.Tensor | None = None,
) -> PackedInputs:
    """A window over box rows ``index`` (``members`` on the host) at box columns ``slots`` [R', Ww]
    (the scratch column where a row's window is shorter); ``(pick_r, source)`` rows of ``index`` and
    window columns, ``picked`` how many per row; ``lengths``: each row's window positions where the host
    knows them (every row's block: nothing is read back; ``lengths_on_device`` the same, where they
    differ), else counted on the device."""
    cache_positions = cache.slot_of[index[:, None], slots]
    keep = cache_positions < cache.total  # absent columns (scratch, hidden suffix) map to the total
    k_start = [cache.row_start[r] for r in members]
    # packed in the cache's order, so that rows whose keys follow each other have their queries adjacent
    order = sorted(range(len(members)), key=k_start.__getitem__)
    starts, ends = cache.row_start_on_device[index], cache.row_len_on_device[index]
    every = None
    if lengths is None:
        lengths = keep.sum(1).tolist()
        rows, columns, window_slot = _pack(keep, torch.tensor(order, device=keep.device), keep.shape[1])
        spans = RowSpans(_starts_in(order, lengths), lengths, k_start, [cache.row_len[r] for r in members])
    else:  # the same order found on the device (row starts are distinct), and the plans derived there
        on_device = torch.argsort(starts)
        rows, columns, window_slot = _pack(keep, on_device, keep.shape[1], sum(lengths))
        spans = RowSpans(_starts_in(order, lengths), lengths, k_start, [cache.row_len[r] for r in members])
        if lengths_on_device is not None or len(set(lengths)) == 1:  # the plans derived on the device
            q_len = torch.full_like(starts, lengths[0]) if lengths_on_device is None else lengths_on_device
            every = varlen_on_device(q_len[on_device], starts[on_device], ends[on_device], spans, cache.total)
    final = _final(spans, picked, picked_on_device, starts, ends, cache.total)
    box_rows, box_columns = index[rows], slots[rows, columns]
    tokens = box.tokens_with_scratch[box_rows, box_columns]
    positions = box.positions_with_scratch[box_rows, box_columns]
    write = None if cache.pool is None else cache.slots(cache_positions[rows, columns])
    reads = PoolRange(cache.base, cache.base + cache.total)
    batch = _batch(tokens, positions, spans, final, every, reads, cache, write)
    return PackedInputs(batch, window_slot[pick_r, source])
