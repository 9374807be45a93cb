"""The dense box's forward batches of a dual-cache cycle (static batching's layout): every row padded to
the box width W, attention under each row's key mask in one call per layer (models/ragged.py's box).

A refresh computes every column of its rows and, where the cycle keeps a dual cache, stores row r's keys
at places ``r (W + 1) + column`` of the cache's run (cycle_cache.py); a window computes each row's
window columns, stores them at their places first and attends over its row's ``W + 1`` places (the last,
the scratch column the window's padding writes, never seen).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine_pod.kinds.bidirectional.cycle_box import CycleBox
from engine_pod.kinds.bidirectional.cycle_cache import CycleCache
from engine_pod.models.forward_batch import ForwardBatch, KeyLayout, PoolRange
from engine_pod.models.ragged import Box, RaggedAttention


def box_refresh(box: CycleBox, index: torch.Tensor | None, cache: CycleCache | None) -> ForwardBatch:
    """The full forward of box rows ``index`` (None: every row), filling ``cache`` where there is one
    (a cache is filled for every row)."""
    if index is None:
        tokens, positions, key_mask = box.tokens, box.position_ids, box.key_mask
    else:
        tokens, positions, key_mask = box.tokens[index], box.position_ids[index], box.key_mask[index]
    if cache is None:
        return ForwardBatch.box_over_itself(tokens, positions, key_mask)
    if index is not None:
        raise ValueError("a refresh fills the dual cache of every row of the cycle")
    rows, width = tokens.shape
    cache.reserve(rows * (width + 1))
    cache.row_width, cache.key_mask = width + 1, F.pad(key_mask, (0, 1))  # the scratch column: never seen
    device = tokens.device
    places = torch.arange(rows, device=device)[:, None] * (width + 1) + torch.arange(width, device=device)
    plan = RaggedAttention.over_box(Box(rows, width, width, key_mask[:, None, :]), device)
    return ForwardBatch(tokens, positions, {None: KeyLayout(plan)}, cache.pool, cache.slots(places.flatten()))


def box_window(box: CycleBox, cache: CycleCache, index: torch.Tensor, all_rows: bool, slots: torch.Tensor):
    """The window forward of box rows ``index`` (``all_rows``: every row, in order) at box columns
    ``slots`` [R', Ww] (the scratch column where a row's window is shorter), over the cached rest."""
    tokens = box.tokens_with_scratch[index].gather(1, slots)
    positions = box.positions_with_scratch[index].gather(1, slots)
    width = cache.row_width
    key_mask = cache.key_mask if all_rows else cache.key_mask.index_select(0, index)
    reads = PoolRange(cache.base, cache.base + cache.total, width, None if all_rows else index)
    plan = RaggedAttention.over_box(Box(*slots.shape, width, key_mask[:, None, :]), tokens.device)
    write = cache.slots((index[:, None] * width + slots).flatten())
    return ForwardBatch(tokens, positions, {None: KeyLayout(plan, reads)}, cache.pool, write)
