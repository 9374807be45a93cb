"""DiffusionGemma's cache layout: the causal context's keys and values, in pages of one ``PagedKVPool``.

The encoder writes them (the prompt, then each committed canvas), the decoder only reads them: every
denoising step of a canvas attends to the same context. A request's context is positions ``[0, length)``
of its page table in the pool (``models/paged_kv.py``, the block-diffusion families' pool): one table per
request for every layer, each page holding its positions' keys (after k_norm and RoPE) and values (after
v_norm) in every layer, each layer in its own shape (the sliding layers' heads, the full layers' fewer and
wider ones). Pages are as long as the canvas.

What a layer attends to of the context: a full-attention layer every position, a sliding-window layer the
last ``sliding_window - 1`` (all that a later query of the encoder can see, and all that the reference's
decoder sees of the context in those layers). A sliding layer's older positions stay in their pages,
unread: a page holds its positions in every layer, and the full layers keep them all. One table for all
layers rather than pages per layer group (the sliding group's freed behind the window): the token budget
charges every context token, and the budget's worst case is rows of short contexts, one page each in
either group, so a pool sized for it would need nearly as many sliding pages as full ones; separate
groups would save memory only where contexts are longer than the window, at the cost of a second table
per request.

``ContextCache`` is one request's handle (its owner in the pool and its length; its slots are the pool's page table);
``ContextBatch`` holds a forward's rows: it writes the encoder's new keys and values into their slots and
lays out what a layer attends over for the attention op (models/ragged.py): every row's kept context,
read from the pool in one gather, then the row's new tokens (the encoder's, or the decoder's canvas),
with the plan that attends each row over its own keys (the layout is made once per batch: the runner
keeps a batch over the steps its rows take together).
``ContextCache.alone`` gives a request a pool of its own (``generate.py``, one request).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.host_bundle import send
from engine_pod.models.attention_rules import Masking, SdpaStyle
from engine_pod.models.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.models.paged_kv import PagedKVPool
from engine_pod.models.ragged import RaggedAttention, RowSpans, starts_of


def context_pool(
    config: DiffusionGemmaConfig, num_pages: int, page_size: int, dtype: torch.dtype, device: torch.device
) -> PagedKVPool:
    """A pool of ``num_pages`` pages of ``page_size`` context positions in every layer."""
    return PagedKVPool(
        config.num_layers,
        num_pages,
        page_size,
        config.layer_kv_heads,
        config.layer_head_dims,
        dtype,
        device,
    )


class ContextCache:
    """One request's context in the pool: ``length`` tokens encoded, their slots in position order."""

    def __init__(self, pool: PagedKVPool, owner: str, config: DiffusionGemmaConfig) -> None:
        self.pool, self.owner = pool, owner
        reach = config.sliding_window - 1
        # per layer: how many of the last context positions it attends to (None: all)
        self.reach = [reach if config.is_sliding(layer) else None for layer in range(config.num_layers)]
        self.length = 0  # context tokens encoded: the next token's position (its slots: the pool's table)

    @classmethod
    def alone(
        cls, config: DiffusionGemmaConfig, tokens: int, dtype: torch.dtype, device: torch.device
    ) -> ContextCache:
        """A request's context of up to ``tokens`` tokens, in a pool of its own."""
        page = config.canvas_length
        return cls(context_pool(config, -(-tokens // page), page, dtype, device), "alone", config)

    def start(self, layer: int) -> int:
        """The first context position ``layer`` attends to."""
        reach = self.reach[layer]
        return 0 if reach is None else max(0, self.length - reach)

    def kept(self, layer: int) -> int:
        """How many context tokens ``layer`` attends to (the last ones)."""
        return self.length - self.start(layer)

    def reserve(self, tokens: int) -> None:
        """Pages for ``tokens`` more context tokens (raises ``PoolExhausted`` when the pool is short)."""
        self.pool.reserve(self.owner, self.length + tokens)

    def advance(self, tokens: int) -> None:
        """Record that the encoder has written the ``tokens`` reserved last in every layer."""
        self.length += tokens

    def release(self) -> None:
        """Give the pages back (the request finished, left or is re-encoded): the context is empty."""
        self.pool.release(self.owner)
        self.length = 0


class ContextBatch:
    """The rows of one forward, row r over ``caches[r]`` (every cache in one pool)."""

    def __init__(self, caches: list[ContextCache]) -> None:
        self.caches = caches
        self.pool = caches[0].pool
        if any(cache.pool is not self.pool for cache in caches):
            raise ValueError("the rows of one forward must keep their contexts in one pool")
        self._layouts: dict[tuple, _Layout] = {}
        self._lengths: tuple[tuple[int, ...], torch.Tensor] | None = None
        self._new_slots: dict[int, torch.Tensor] = {}  # the encoder's slots, per new-token count

    def positions(self, tokens: int, device: torch.device) -> torch.Tensor:
        """[R, T]: row r's tokens continue its context (positions caches[r].length..); the lengths are sent
        to the device once per batch (a decoder's batch keeps them over its steps)."""
        lengths = tuple(cache.length for cache in self.caches)
        if self._lengths is None or self._lengths[0] != lengths:
            self._lengths = (lengths, torch.tensor(lengths).to(device))
        return torch.arange(tokens, device=device) + self._lengths[1][:, None]

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The new context tokens' keys/values [R, Hkv, T, hd] into the slots each row reserved (sent to
        the device once per batch)."""
        tokens = keys.shape[2]
        if tokens not in self._new_slots:
            spans = [(cache.owner, cache.length, cache.length + tokens) for cache in self.caches]
            self._new_slots[tokens] = self.pool.flat_slots(spans)
        slots = self._new_slots[tokens]
        self.pool.keys[layer].index_copy_(0, slots, keys.transpose(1, 2).flatten(0, 1))
        self.pool.values[layer].index_copy_(0, slots, values.transpose(1, 2).flatten(0, 1))

    def keys_values(
        self,
        layer: int,
        tokens: int,
        masking: Masking,
        style: SdpaStyle,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> tuple[RaggedAttention, torch.Tensor, torch.Tensor]:
        """The attention plan of ``tokens`` new tokens per row in ``layer`` and the keys and values it
        reads [N, Hkv, hd]: row after row, the context the layer keeps (one gather from the pool) then
        the rows' new keys/values [R, Hkv, T, hd]. Layers of one reach share the layout."""
        layout = self._layout(layer, tokens, masking, style)
        stored = (self.pool.keys[layer], self.pool.values[layer])
        packed = []
        for pool_entries, new in zip(stored, (keys, values)):
            out = pool_entries.new_empty(layout.total, *pool_entries.shape[1:])
            if layout.slots.numel():
                out.index_copy_(0, layout.context_at, pool_entries.index_select(0, layout.slots))
            out.index_copy_(0, layout.new_at, new.transpose(1, 2).flatten(0, 1))
            packed.append(out)
        return layout.plan, packed[0], packed[1]

    def _layout(self, layer: int, tokens: int, masking: Masking, style: SdpaStyle) -> _Layout:
        """Made once per batch for each reach, new-token count and masking."""
        key = (self.caches[0].reach[layer], tokens, masking, style)
        if key not in self._layouts:
            kept = [cache.kept(layer) for cache in self.caches]
            lengths = [n + tokens for n in kept]
            starts = starts_of(lengths)
            context_at = [p for start, n in zip(starts, kept) for p in range(start, start + n)]
            new_at = [p for start, n in zip(starts, kept) for p in range(start + n, start + n + tokens)]
            device = self.pool.device
            spans = RowSpans([r * tokens for r in range(len(kept))], [tokens] * len(kept), starts, lengths)
            slots = self.pool.host_slots(
                [(cache.owner, cache.start(layer), cache.length) for cache in self.caches]
            )
            sent = send([slots, context_at, new_at], device)  # the layout's one copy
            self._layouts[key] = _Layout(RaggedAttention(spans, device, masking, style), *sent, sum(lengths))
        return self._layouts[key]


@dataclass(frozen=True)
class _Layout:
    """A batch's keys in one layer, packed row after row: each row's kept context, then its new tokens."""

    plan: RaggedAttention
    slots: torch.Tensor  # pool slots of every row's kept context, row after row
    context_at: torch.Tensor  # where they go in the packed keys
    new_at: torch.Tensor  # where the rows' new tokens go, row after row
    total: int
