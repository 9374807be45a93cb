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
``ContextBatch`` holds a forward's rows, each with its own number of new tokens (the encoder's chunks,
packed one row after another; the decoder's canvases, one length): it writes the encoder's new keys and
values into their slots and lays out what a layer attends over for the attention op (models/ragged.py):
every row's kept context, read from the pool in one gather, then the row's new tokens, with the plan that
attends each row over its own keys. Everything the device needs of a batch (the tokens' positions, the
encoder's slots, each reach's layout, and lists the caller adds) goes in one copy when the batch is made;
the rows that go on when others stop (``rows``) are picked out of it on the device, with no copy.
``ContextCache.alone`` gives a request a pool of its own (``generate.py``, one request).
"""

from __future__ import annotations

import torch

from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.families.diffusion_gemma.context_layout import ContextLayout
from engine_pod.host_bundle import Floats, send_named
from engine_pod.models.attention_rules import Masking, SdpaStyle
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
    """The rows of one forward, row r over ``caches[r]`` (every cache in one pool) with ``tokens[r]`` new
    tokens: a batch made by ``of`` (one copy to the device) or picked out of one by ``rows`` (none)."""

    def __init__(
        self,
        caches: list[ContextCache],
        tokens: list[int],
        token_positions: torch.Tensor,
        new_slots: torch.Tensor,
        layouts: dict[int | None, ContextLayout],
        extra: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.caches, self.pool, self.tokens = caches, caches[0].pool, tokens
        self.token_positions, self.new_slots, self.layouts = token_positions, new_slots, layouts
        self.extra = extra or {}  # the caller's lists by name, sent in the batch's copy
        self._plans: dict[tuple, RaggedAttention] = {}

    @classmethod
    def of(
        cls,
        caches: list[ContextCache],
        tokens: int | list[int],
        extra: dict[str, list[int] | Floats] | None = None,
        writing: bool = False,
    ) -> ContextBatch:
        """The batch of ``caches`` with ``tokens`` new tokens each (one count: every row's), its positions,
        where the new tokens go in the pool when ``writing`` (the encoder's: the caches reserved them),
        each reach's layout and ``extra`` (the caller's lists, by name) sent to the device in one copy."""
        pool = caches[0].pool
        if any(cache.pool is not pool for cache in caches):
            raise ValueError("the rows of one forward must keep their contexts in one pool")
        tokens = [tokens] * len(caches) if isinstance(tokens, int) else list(tokens)
        reaches = sorted(set(caches[0].reach), key=lambda reach: (reach is None, reach or 0))
        spans = {reach: _spans(caches, tokens, reach) for reach in reaches}
        parts = {
            "positions": _positions(caches, tokens),
            "new_slots": _new_slots(caches, tokens) if writing else [],
        }
        for reach in reaches:
            parts |= {
                f"{reach}/{name}": values
                for name, values in _layout_lists(caches, spans[reach], reach).items()
            }
        extra = extra or {}
        sent = send_named(parts | extra, pool.device)  # the batch's one copy
        layouts = {
            reach: ContextLayout(spans[reach], **{name: sent[f"{reach}/{name}"] for name in LAYOUT_FIELDS})
            for reach in reaches
        }
        return cls(
            caches,
            tokens,
            sent["positions"],
            sent["new_slots"],
            layouts,
            {name: sent[name] for name in extra},
        )

    def positions(self, shape: torch.Size) -> torch.Tensor:
        """The new tokens' positions (each row's continue its context), shaped as the forward's tokens."""
        return self.token_positions.view(shape)

    def rows(self, keep: list[int], index: torch.Tensor) -> ContextBatch:
        """The batch of rows ``keep`` alone (``index``: them on the device), laid out on the device from this
        one: their keys stay where this batch packs them, nothing is copied from the host."""
        tokens = self.tokens[0]
        if any(count != tokens for count in self.tokens):
            raise ValueError("only a batch of one new-token count (the decoder's) can drop rows")
        return ContextBatch(
            [self.caches[r] for r in keep],
            [tokens] * len(keep),
            self.token_positions.view(-1, tokens).index_select(0, index).flatten(),
            self.new_slots[:0],
            {reach: layout.rows(keep, index, tokens) for reach, layout in self.layouts.items()},
        )

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The new context tokens' keys/values [R, Hkv, T, hd] (or [1, Hkv, N, hd] packed) into the slots
        each row reserved."""
        if self.new_slots.numel() != sum(self.tokens):
            raise ValueError("a batch made without writing has no slots for new context tokens")
        self.pool.keys[layer].index_copy_(0, self.new_slots, keys.transpose(1, 2).flatten(0, 1))
        self.pool.values[layer].index_copy_(0, self.new_slots, values.transpose(1, 2).flatten(0, 1))

    def keys_values(
        self,
        layer: int,
        masking: Masking,
        style: SdpaStyle,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> tuple[RaggedAttention, torch.Tensor, torch.Tensor]:
        """The attention plan of the new tokens in ``layer`` and the keys and values it reads [N, Hkv, hd]:
        row after row, the context the layer keeps (one gather from the pool) then the rows' new
        keys/values [R, Hkv, T, hd] (or packed [1, Hkv, N, hd]). Layers of one reach share the layout."""
        reach = self.caches[0].reach[layer]
        layout = self.layouts[reach]
        stored = (self.pool.keys[layer], self.pool.values[layer])
        packed = []
        for pool_entries, new in zip(stored, (keys, values)):
            out = pool_entries.new_empty(layout.total, *pool_entries.shape[1:])
            if layout.slots.numel():
                out.index_copy_(0, layout.context_at, pool_entries.index_select(0, layout.slots))
            out.index_copy_(0, layout.new_at, new.transpose(1, 2).flatten(0, 1))
            packed.append(out)
        return self._plan(reach, masking, style), packed[0], packed[1]

    def _plan(self, reach: int | None, masking: Masking, style: SdpaStyle) -> RaggedAttention:
        """Made once per batch for each reach, masking and style: its spans from host ints, its varlen
        batch derived on the device from the batch's copy."""
        key = (reach, masking, style)
        if key not in self._plans:
            layout = self.layouts[reach]
            self._plans[key] = RaggedAttention(
                layout.spans, self.pool.device, masking, style, layout.varlen()
            )
        return self._plans[key]


def _start(length: int, reach: int | None) -> int:
    """The first context position a layer of this reach attends to (None: every one)."""
    return 0 if reach is None else max(0, length - reach)


def _spans(caches: list[ContextCache], tokens: list[int], reach: int | None) -> RowSpans:
    """Each row's queries (its new tokens, packed) and keys (its kept context, then its new tokens)."""
    lengths = [cache.length - _start(cache.length, reach) + t for cache, t in zip(caches, tokens)]
    return RowSpans(starts_of(tokens), tokens, starts_of(lengths), lengths)


def _positions(caches: list[ContextCache], tokens: list[int]) -> list[int]:
    return [p for cache, t in zip(caches, tokens) for p in range(cache.length, cache.length + t)]


def _new_slots(caches: list[ContextCache], tokens: list[int]) -> list[int]:
    """Where each row's new tokens go in the pool (reserved beforehand)."""
    spans = [(cache.owner, cache.length, cache.length + t) for cache, t in zip(caches, tokens)]
    return caches[0].pool.host_slots(spans)


# what _layout_lists gives a reach: pool slots of its kept context, their places and the new tokens' in the
# packed keys, each row's kept count, and its rows' [new tokens, key starts, keys] (RowSpans on the device)
LAYOUT_FIELDS = ("slots", "context_at", "new_at", "kept", "extents")


def _layout_lists(caches: list[ContextCache], spans: RowSpans, reach: int | None) -> dict[str, list[int]]:
    """[pool slots of every row's kept context, where they go in the packed keys, where the new tokens
    go, each row's kept count]."""
    kept = [k - t for k, t in zip(spans.k_len, spans.q_len)]
    context_at = [p for start, n in zip(spans.k_start, kept) for p in range(start, start + n)]
    new_at = [
        p for start, n, t in zip(spans.k_start, kept, spans.q_len) for p in range(start + n, start + n + t)
    ]
    slots = caches[0].pool.host_slots(
        [(cache.owner, _start(cache.length, reach), cache.length) for cache in caches]
    )
    extents = spans.q_len + spans.k_start + spans.k_len
    return {"slots": slots, "context_at": context_at, "new_at": new_at, "kept": kept, "extents": extents}
