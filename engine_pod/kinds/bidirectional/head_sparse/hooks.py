"""How a forward of a head-sparse cycle attends (a ``ForwardBatch``'s ``heads``).

Refresh: every row attends over all its keys as without sparsity (the same call); then each layer's
heads score the row's keys (head_sparse/scores.py, as the settings say) and the cycle's store keeps their
top positions. With a selection delay, the block's first forwards compute every position without this
(stepper.py): the refresh that selects is the one after them.
Window: per head group, the block's new keys and values are written over the group's block entries,
then the group's query heads attend over the group's store: one attention call per group and layer
(head-centric: three, for core, regular and minor heads; uniform: one).
"""

from __future__ import annotations

import torch

from engine_pod.kinds.bidirectional.head_sparse.store import CycleStore
from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.ragged import RaggedAttention, RowSpans, starts_of


def _query_rows(counts: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, widest] places of each row's ``counts`` queries, packed one row after another, and which are real."""
    starts, widest = starts_of(counts), max(max(counts), 1)
    offsets = torch.arange(widest, device=device)
    sent = torch.tensor([starts, counts], device=device)
    valid = offsets < sent[1][:, None]
    return torch.where(valid, sent[0][:, None] + offsets, 0), valid


class RefreshHeads:
    """The refresh: dense attention, then each layer's kept entries (``block_places`` [R, L]: each row's
    active-block queries; ``picked``: each row's last-layer queries, counted on the host)."""

    def __init__(self, store: CycleStore, block_places: torch.Tensor, picked: list[int], layers: int) -> None:
        self.store, self.layers = store, layers
        self.block = (block_places, torch.ones_like(block_places, dtype=torch.bool))
        self.final = _query_rows(picked, block_places.device)
        self.has_final = self.final[1].any(1)
        self.last: torch.Tensor | None = None

    def attend(self, batch, layer: int, q, k, v, final: bool) -> torch.Tensor:
        out = batch.attend_dense(layer, q, k, v, final)
        queries, own_k, own_v = q.transpose(1, 2).flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
        places, valid = self.final if final else self.block
        scale = batch.layout(layer, final).plan.style.scale or q.shape[-1] ** -0.5
        keys = own_k[self.store.key_index]
        scores = self.store.scores(queries[places], valid, keys, scale)
        if final and self.last is not None:  # a row with no last-layer query ranks as the layer before
            scores = torch.where(self.has_final[:, None, None], scores, self.last)
        self.last = scores
        self.store.keep(layer, scores, own_k, own_v)
        if layer == self.layers - 1:
            self.store.finish()
        return out


class WindowHeads:
    """A window over the rows ``members`` (box rows, the window's row order: each row's block, in the
    refresh's packing order) whose last layer computes ``picked`` queries of each (in ``last_rows``' order)."""

    def __init__(
        self, store: CycleStore, members: list[int], last_rows: list[int], picked: list[int]
    ) -> None:
        self.store = store
        L, device = store.block_length, store.device
        self.rows = torch.tensor(members, device=device)
        self.offsets = torch.arange(L, device=device)[None, :, None]
        self.plans = [self._plan(rows, members, [L] * len(members)) for rows in store.rows]
        self.final_plans = [self._plan(rows, last_rows, picked) for rows in store.rows]

    def _plan(self, rows, members: list[int], counts: list[int]) -> RaggedAttention:
        spans = RowSpans(
            starts_of(counts), counts, [rows.start[r] for r in members], [rows.kept[r] for r in members]
        )
        return RaggedAttention(spans, self.store.device)

    def attend(self, batch, layer: int, q, k, v, final: bool) -> torch.Tensor:
        rows, heads, tokens, width = q.shape
        store, sparse = self.store, self.store.sparse
        queries, own_k, own_v = q.transpose(1, 2).flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
        out = queries.new_empty(queries.shape[0], heads, own_v.shape[-1])
        for g in range(len(store.rows)):
            kv, qh = sparse.head_index[layer][g], sparse.query_heads[layer][g]
            stored_k, stored_v = store.keys[layer][g], store.values[layer][g]
            slots = (store.block_base[layer][g][self.rows][:, None, :] + self.offsets).flatten(0, 1)
            lanes = torch.arange(kv.shape[0], device=kv.device)[None, :]
            stored_k[slots, lanes] = own_k[:, kv]
            stored_v[slots, lanes] = own_v[:, kv]
            plan = self.final_plans[g] if final else self.plans[g]
            out[:, qh] = ragged_attention(queries[:, qh], stored_k, stored_v, plan)
        return out.view(rows, tokens, heads, width)


def refresh_heads(box, cache, picked: list[int], layers: int) -> RefreshHeads:
    """A packed refresh's attention (its layout already in ``cache``, packing.py): the cycle's store,
    filled by its layers (every row of the cycle, ``picked``: each row's last-layer queries)."""
    L = box.block_length
    block_start = [n - L for n in box.host.context_lengths]
    device = cache.slot_of.device
    cache.store = CycleStore(
        cache.heads, cache.pools, cache.owners, cache.row_start, cache.row_len, block_start, L, device
    )
    return RefreshHeads(cache.store, cache.slot_of.gather(1, box.block_slots), picked, layers)


def window_heads(cache, members: list[int], picked: list[int]) -> WindowHeads:
    """A packed window's attention over the cycle's store (rows ``members``, each row's block)."""
    return WindowHeads(cache.store, sorted(members, key=cache.row_start.__getitem__), members, picked)
