"""From the dense canvas (the runner's bookkeeping) to a packed forward's inputs: only the positions that
exist, rows one after another (models/packed.py).

A refresh forward computes each row's attended positions (prompt, committed blocks, active block, and
the suffix where attention sees it; a hidden suffix is neither a key nor read, so it is skipped). A
window forward computes the window positions that exist and writes their keys at their rows' cache
positions. The canvas columns map to packed positions through ``slot_of``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.models.packed import PackedContext, PackedKVCache, selected_spans
from engine_pod.models.ragged import RaggedAttention, RowSpans, starts_of
from engine_pod.runner.canvas import Canvas


@dataclass(frozen=True)
class PackedInputs:
    tokens: torch.Tensor  # [N] token ids
    positions: torch.Tensor  # [N] position ids
    context: PackedContext
    select: torch.Tensor  # [n] packed positions whose logits are needed, in the caller's order

    @property
    def computed(self) -> int:
        return self.tokens.shape[0]


def refresh_inputs(
    canvas: Canvas,
    index: torch.Tensor | None,
    cache: PackedKVCache | None,
    pick_r: torch.Tensor,
    source: torch.Tensor,
) -> PackedInputs:
    """A refresh over canvas rows ``index`` (None: all); ``(pick_r, source)`` the (row, column) pairs
    whose logits are needed."""
    take = (lambda t: t) if index is None else (lambda t: t[index])
    keep = take(canvas.key_mask)
    lengths = keep.sum(1)
    order = torch.argsort(lengths, descending=True, stable=True)  # packed order: rows of a length adjacent
    rows, columns, slot_of = _pack(keep, order, canvas.width + 1)
    spans = _spans_in_order(lengths.tolist(), order.tolist())
    if cache is not None:
        cache.set_layout(slot_of, spans.k_start, spans.k_len)
    return PackedInputs(
        take(canvas.tokens)[rows, columns],
        take(canvas.position_ids)[rows, columns],
        _context(spans, pick_r, keep.device, cache),
        slot_of[pick_r, source],
    )


def _pack(
    keep: torch.Tensor, order: torch.Tensor, map_width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The positions where ``keep`` [R, C] is True, packed row by row in ``order``: each packed
    position's (row, column), and the map [R, map_width] from (row, column) to packed position (the
    packed total where a column is not packed)."""
    sorted_rows, columns = keep[order].nonzero(as_tuple=True)
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


def _context(
    spans: RowSpans,
    pick_r: torch.Tensor,
    device: torch.device,
    cache: PackedKVCache | None,
    cache_positions: torch.Tensor | None = None,
) -> PackedContext:
    """Both attention plans: every position's, and the last layer's over the picked positions (pick_r
    comes from a row-major nonzero, so picks are grouped by row in order)."""
    picked = torch.bincount(pick_r, minlength=len(spans.q_len)).tolist()
    final = RaggedAttention(selected_spans(spans, picked), device)
    return PackedContext(RaggedAttention(spans, device), final, cache, cache_positions)


def window_inputs(
    canvas: Canvas,
    cache: PackedKVCache,
    index: torch.Tensor,
    slots: torch.Tensor,
    pick_r: torch.Tensor,
    source: torch.Tensor,
) -> PackedInputs:
    """A window over canvas rows ``index`` at canvas columns ``slots`` [R', Ww] (the scratch column where
    a row's window is shorter); ``(pick_r, source)`` rows of ``index`` and window columns."""
    cache_positions = cache.slot_of[index[:, None], slots]
    keep = cache_positions < cache.total  # absent columns (scratch, hidden suffix) map to the total
    members = index.tolist()
    k_start = [cache.row_start[r] for r in members]
    # packed in the cache's order, so that rows whose keys follow each other have their queries adjacent
    order = sorted(range(len(members)), key=k_start.__getitem__)
    rows, columns, window_slot = _pack(keep, torch.tensor(order, device=keep.device), keep.shape[1])
    lengths = keep.sum(1).tolist()
    spans = RowSpans(_starts_in(order, lengths), lengths, k_start, [cache.row_len[r] for r in members])
    canvas_rows, canvas_columns = index[rows], slots[rows, columns]
    return PackedInputs(
        canvas.tokens_with_scratch[canvas_rows, canvas_columns],
        canvas.positions_with_scratch[canvas_rows, canvas_columns],
        _context(spans, pick_r, keep.device, cache, cache_positions[rows, columns]),
        window_slot[pick_r, source],
    )
