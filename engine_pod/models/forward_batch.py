"""One forward's batch: the one way every family's layers attend, ``batch.attend(layer, q, k, v)``.

A forward computes rows of queries, either a padded box ``[R, Q]`` (static batching) or rows packed one
after another ``[1, N]``. At each layer the batch stores the queries' keys and values in the KV pool where
it was given slots for them (models/paged_kv.py, the one KV store of every family), lays out the keys the
layer reads (its ``KeySource``) and calls the engine's attention op once (models/attention_backends.py)
with the layer's plan (models/ragged.py). Where the layers differ in what they see (DiffusionGemma's
sliding and full layers), each group of layers has its own layout.

Each cache kind has its builder: kinds/bidirectional/box_batches.py (LLaDA and Dream's dual cache),
kinds/block_causal/batches.py (block diffusion's paged cache) and kinds/canvas/context_cache.py
(DiffusionGemma's context cache).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.gather_scratch import GatherScratch
from engine_pod.models.paged_kv import PagedKVPool
from engine_pod.models.ragged import Box, RaggedAttention


class KeySource(Protocol):
    """Where a layer's keys (and, the same way, its values) come from."""

    def read(self, stored: torch.Tensor | None, own: torch.Tensor) -> torch.Tensor:
        """The keys the plan reads [Nk, Hkv, hd], from the pool's entries of the layer ``stored``
        [slots + 1, Hkv, hd] (None: no pool) and the forward's own [N, Hkv, hd]."""
        ...


@dataclass(frozen=True)
class OwnKeys:
    """The forward's own keys (a refresh: every key is computed in this forward)."""

    def read(self, stored: torch.Tensor | None, own: torch.Tensor) -> torch.Tensor:
        return own


@dataclass(frozen=True)
class PoolRange:
    """A run of consecutive slots ``[start, end)``, read as a view; with ``row_width``, a box of rows of that
    many slots each, of which ``rows`` (None: all, in order) are read."""

    start: int
    end: int
    row_width: int | None = None
    rows: torch.Tensor | None = None

    def read(self, stored: torch.Tensor | None, own: torch.Tensor) -> torch.Tensor:
        region = _stored(stored)[self.start : self.end]
        if self.row_width is None:
            return region
        box = region.view(-1, self.row_width, *region.shape[1:])
        return (box if self.rows is None else box.index_select(0, self.rows)).flatten(0, 1)


@dataclass(frozen=True)
class PoolSlots:
    """The entries at ``slots`` [Nk], gathered (pages anywhere in the pool): into the pool's ``scratch``
    where it is given (models/gather_scratch.py), else into a new tensor."""

    slots: torch.Tensor
    scratch: GatherScratch | None = None

    def read(self, stored: torch.Tensor | None, own: torch.Tensor) -> torch.Tensor:
        if self.scratch is not None:
            return self.scratch.gather(_stored(stored), self.slots)
        return _stored(stored).index_select(0, self.slots)


@dataclass(frozen=True)
class ContextThenOwn:
    """Row after row, the row's kept context (the pool's entries at ``slots``, placed at ``context_at``) and
    its own new keys (placed at ``own_at``): ``total`` keys in all."""

    slots: torch.Tensor
    context_at: torch.Tensor
    own_at: torch.Tensor
    total: int

    def read(self, stored: torch.Tensor | None, own: torch.Tensor) -> torch.Tensor:
        pool = _stored(stored)
        out = pool.new_empty(self.total, *pool.shape[1:])
        if self.slots.numel():
            out.index_copy_(0, self.context_at, pool.index_select(0, self.slots))
        return out.index_copy_(0, self.own_at, own)


def _stored(stored: torch.Tensor | None) -> torch.Tensor:
    if stored is None:
        raise ValueError("this forward's keys are read from a KV pool, and it has none")
    return stored


class HeadAttention(Protocol):
    """Attention that replaces ``attend_dense`` for a forward (the head-sparse cache's)."""

    def attend(
        self, batch: ForwardBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, final: bool
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class KeyLayout:
    """What a layer attends over: its plan and where the keys the plan reads come from."""

    plan: RaggedAttention
    source: KeySource = field(default_factory=OwnKeys)


@dataclass
class ForwardBatch:
    """One forward of any family: its tokens and positions (``[R, Q]`` boxed, ``[1, N]`` packed), where its
    queries' keys and values go in the pool (``write_slots`` [R Q]; None: nowhere), each layer group's key
    layout (``layer_groups[layer]`` names a layer's; None: every layer's is ``layouts[None]``) and the last
    layer's where it computes only selected queries (``final``)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    layouts: Mapping[Hashable, KeyLayout]
    pool: PagedKVPool | None = None
    write_slots: torch.Tensor | None = None
    final: KeyLayout | None = None
    layer_groups: Sequence[Hashable] | None = None
    # a head-sparse cycle's forwards attend through it (kinds/bidirectional/head_sparse/hooks.py); None: ``attend_dense``
    heads: HeadAttention | None = None

    @classmethod
    def box_over_itself(
        cls, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor
    ) -> ForwardBatch:
        """A forward of rows [R, T] padded to a box, each over its own tokens where ``key_mask`` [R, T] is
        True, nothing cached (a plain full forward; training's)."""
        rows, width = tokens.shape
        plan = RaggedAttention.over_box(Box(rows, width, width, key_mask[:, None, :]), tokens.device)
        return cls(tokens, positions, {None: KeyLayout(plan)})

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, final: bool = False
    ) -> torch.Tensor:
        """q [R, H, Tq, hd] (after RoPE), k/v token-major [R, T, Hkv, hd] -> token-major [R, Tq, H, hd]:
        the keys and values stored where the batch has slots for them, then every row over its own keys
        in one call. ``final``: the queries are the last layer's selected ones (the keys still every
        position's)."""
        if self.heads is not None:
            return self.heads.attend(self, layer, q, k, v, final)
        return self.attend_dense(layer, q, k, v, final)

    def attend_dense(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, final: bool = False
    ) -> torch.Tensor:
        """``attend`` with every head over the batch's key layout (what a batch without ``heads`` does)."""
        own_k, own_v = k.flatten(0, 1), v.flatten(0, 1)
        if self.write_slots is not None:
            if self.pool is None:
                raise ValueError("this forward has slots to write its keys to, and no KV pool")
            self.pool.write(layer, self.write_slots, own_k, own_v)
        layout = self.layout(layer, final)
        stored_k = None if self.pool is None else self.pool.keys[layer]
        stored_v = None if self.pool is None else self.pool.values[layer]
        keys, values = layout.source.read(stored_k, own_k), layout.source.read(stored_v, own_v)
        rows, heads, tokens, width = q.shape
        queries = q.transpose(1, 2).flatten(0, 1)
        if torch.is_grad_enabled() and q.requires_grad:  # training: the op has no autograd formula
            return layout.plan.reference(queries, keys, values).view(rows, tokens, heads, width)
        return ragged_attention(queries, keys, values, layout.plan).view(rows, tokens, heads, width)

    def layout(self, layer: int, final: bool = False) -> KeyLayout:
        if final:
            if self.final is None:
                raise ValueError("this forward has no last-layer layout: every layer computes every query")
            return self.final
        return self.layouts[None if self.layer_groups is None else self.layer_groups[layer]]
