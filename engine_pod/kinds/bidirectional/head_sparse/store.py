"""The head-sparse dual cache of one block cycle: per layer and head group, a compact store of the kept
keys and values of every row (what the cycle's memory is), filled at the refresh, read and rewritten
(the active block's entries) by the window forwards.

A group's heads keep the same count of each row: row r holds ``kept[r]`` entries from ``start[r]``
(rows in the refresh's packing order), each head's entries in position order, the active block (always
kept) a run of L of them at ``block_base[r, head]``. The stores are views of pages of the runner's KV pool,
as many as what is kept fills (head_sparse/kept_pages.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_contracts.head_sparse_config import HeadSparseConfig
from engine_pod.kinds.bidirectional.head_sparse.groups import HeadGroup, kept_context, model_groups
from engine_pod.kinds.bidirectional.head_sparse.kept_pages import OWNER as PAGES_OWNER
from engine_pod.kinds.bidirectional.head_sparse.kept_pages import KeptPages
from engine_pod.kinds.bidirectional.head_sparse.scores import (
    consistent_ranking,
    kept_positions,
    pooled,
    selection_scores,
)
from engine_pod.models.ragged import starts_of


@dataclass
class GroupRows:
    """One group's row layout in its store, the same at every layer (host lists by box row)."""

    kept: list[int]  # entries of each row (its kept context and its block)
    start: list[int]  # each row's first entry
    total: int
    kept_on_device: torch.Tensor  # [R]
    start_on_device: torch.Tensor  # [R]
    entries: tuple[torch.Tensor, torch.Tensor]  # each entry's (row, rank in the row), in store order


class HeadSparse:
    """The runner's part: each layer's head groups and each request's last ranking (cross-step
    consistency), kept for the requests still running."""

    def __init__(self, config: HeadSparseConfig, layers: int, heads: int, kv_heads: int, device) -> None:
        self.config = config
        self.queries_per_head = heads // kv_heads
        self.groups: list[list[HeadGroup]] = model_groups(config, layers, kv_heads, self.queries_per_head)
        self.head_index = [[torch.tensor(g.heads, device=device) for g in layer] for layer in self.groups]
        g = self.queries_per_head
        self.query_heads = [
            [torch.tensor([h * g + i for h in grp.heads for i in range(g)], device=device) for grp in layer]
            for layer in self.groups
        ]
        self.rankings: dict[str, torch.Tensor] = {}  # owner -> [layers, Hkv, keys] at its last refresh

    @classmethod
    def of(cls, loaded, config: HeadSparseConfig) -> HeadSparse | None:
        """The runner's part for a loaded model, where the settings turn the cache on (else None)."""
        if not config.on:
            return None
        if loaded.parallel.size > 1:
            raise ValueError("the head-sparse cache runs in one process (no tensor parallelism)")
        shape = loaded.config
        return cls(config, shape.num_layers, shape.num_heads, shape.num_kv_heads, loaded.device)

    def release(self, owners: list[str]) -> None:
        for owner in owners:
            self.rankings.pop(owner, None)

    def forget(self) -> None:
        self.rankings.clear()


def position_bytes(config, dtype: torch.dtype) -> int:
    """A position's keys and values in every layer of a model of ``config`` (what a dense cache holds)."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype.itemsize


class CycleStore:
    """One cycle's compact stores, built at its refresh (rows: every row of the cycle, box order)."""

    def __init__(
        self,
        sparse: HeadSparse,
        pools,
        owners: list[str],
        k_start: list[int],
        k_len: list[int],
        block_start: list[int],
        block_length: int,
        device,
        pages_owner: str = PAGES_OWNER,
    ) -> None:
        self.sparse, self.owners, self.device = sparse, owners, device
        self.k_len, self.block_length = k_len, block_length
        rows, width = len(k_len), max(k_len)
        sent = torch.tensor([k_start, k_len, block_start], device=device)
        self.k_start, k_len_d, self.block_start = sent.unbind(0)
        offsets = torch.arange(width, device=device)
        self.k_valid = offsets < k_len_d[:, None]  # [R, K]
        self.block = (offsets >= self.block_start[:, None]) & (
            offsets < self.block_start[:, None] + block_length
        )
        self.key_index = (self.k_start[:, None] + offsets).clamp(max=sum(k_len) - 1)  # [R, K] packed places
        order = sorted(range(rows), key=k_start.__getitem__)  # the refresh's packing order
        self.rows = [self._rows(group.retention, order) for group in sparse.groups[0]]
        layers = len(sparse.groups)
        counts, heads = [rows.total for rows in self.rows], [len(group.heads) for group in sparse.groups[0]]
        # pools: the runner's CycleCachePool; pages_owner: the run's owner in its pool
        self.pages = KeptPages(pools, counts, heads, layers, pages_owner)
        self.block_base: list[list[torch.Tensor]] = [[] for _ in range(layers)]
        self.previous, self.previous_len = self._previous(width)
        self.rankings: list[torch.Tensor] = []

    def _rows(self, retention: float, order: list[int]) -> GroupRows:
        L = self.block_length
        kept = [kept_context(retention, n - L) + L for n in self.k_len]
        starts_in_order = starts_of([kept[r] for r in order])
        start = [0] * len(kept)
        for r, s in zip(order, starts_in_order):
            start[r] = s
        kept_on_device, start_on_device = torch.tensor([kept, start], device=self.device).unbind(0)
        ranks = torch.arange(max(kept), device=self.device)
        real = ranks < kept_on_device[:, None]
        in_order = torch.tensor(order, device=self.device)
        row, rank = real[in_order].nonzero(as_tuple=True)
        return GroupRows(kept, start, sum(kept), kept_on_device, start_on_device, (in_order[row], rank))

    def _previous(self, width: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Each row's ranking at its request's previous refresh, padded [R, layers, Hkv, K], and its length."""
        rankings = self.sparse.rankings
        if self.sparse.config.consistency >= 1.0 or not any(o in rankings for o in self.owners):
            return None, None
        layers = len(self.sparse.groups)
        heads = sum(len(g.heads) for g in self.sparse.groups[0])
        previous = torch.zeros(len(self.owners), layers, heads, width, device=self.device)
        lengths = []
        for r, owner in enumerate(self.owners):
            past = rankings.get(owner)
            n = 0 if past is None else min(past.shape[-1], width)
            if n:
                previous[r, ..., :n] = past[..., :n]
            lengths.append(n)
        return previous, torch.tensor(lengths, device=self.device)

    def scores(
        self, queries: torch.Tensor, q_valid: torch.Tensor, keys: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Each head's scores [R, Hkv, K] of each row's keys ([R, K, Hkv, hd], at ``key_index``) from its
        scoring ``queries`` [R, Q, H, hd] (``q_valid`` the real ones), scored, shared and pooled as the
        settings say (head_sparse/scores.py)."""
        config = self.sparse.config
        shared = config.selection == "shared"
        scores = selection_scores(queries, q_valid, keys, self.k_valid, scale, config.scoring, shared)
        return pooled(scores, self.k_valid & ~self.block, config.pool_kernel)

    def keep(self, layer: int, scores: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The layer's kept entries from its refresh's keys and values [N, Hkv, hd] (packed places) and its
        heads' scores [R, Hkv, K]."""
        ranking = scores
        if self.previous is not None:
            past = self.previous[:, layer].to(scores.dtype)
            ranking = consistent_ranking(scores, past, self.previous_len, self.sparse.config.consistency)
        self.rankings.append(torch.where(self.block[:, None], scores, ranking))
        for g, rows in enumerate(self.rows):
            heads = self.sparse.head_index[layer][g]
            most = max(rows.kept)
            positions = kept_positions(ranking[:, heads], self.block, self.k_valid, rows.kept_on_device, most)
            row, rank = rows.entries
            places = self.k_start[row, None] + positions[row, :, rank]  # [T, Hg]
            self.keys[layer][g].copy_(keys[places, heads[None, :]])
            self.values[layer][g].copy_(values[places, heads[None, :]])
            before = (positions < self.block_start[:, None, None]).sum(-1)  # [R, Hg] kept ahead of the block
            self.block_base[layer].append(rows.start_on_device[:, None] + before)

    def finish(self) -> None:
        """After the refresh's last layer: each request's rankings for its next refresh."""
        stacked = torch.stack(self.rankings, 1)  # [R, layers, Hkv, K]
        for r, owner in enumerate(self.owners):
            if owner:
                self.sparse.rankings[owner] = stacked[r, ..., : self.k_len[r]].clone()
        self.rankings = []

    @property
    def keys(self) -> list[list[torch.Tensor]]:
        """[layer][group]: the kept keys [n_g, Hg, head_dim], views of the pool."""
        return self.pages.keys

    @property
    def values(self) -> list[list[torch.Tensor]]:
        return self.pages.values

    def kept_bytes(self) -> int:
        return sum(t.nbytes for layer in self.keys + self.values for t in layer)

    def release(self) -> None:
        """Give its pages back (nothing refers to its entries any more)."""
        self.pages.release()
