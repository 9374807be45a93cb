"""The canvas kind's cache (DiffusionGemma's): the causal context's keys and values, in pages of one pool.

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
``ContextRows`` holds a forward's rows, each with its own number of new tokens (the encoder's chunks,
packed one row after another; the decoder's canvases, one length), and makes the ``ForwardBatch``
(models/forward_batch.py) the layers attend through: the encoder's new keys and values go into their
slots, and each group of layers (one reach, one head width) attends over every row's kept context, read
from the pool in one gather (``ContextThenOwn``), then the row's new tokens, with the plan that attends
each row over its own keys (models/ragged.py), causal in the encoder, unmasked in the decoder. Everything
the device needs of the rows (the tokens' positions, the encoder's slots, each reach's layout, and lists
the caller adds) goes in one copy when they are made; the rows that go on when others stop (``rows``)
are picked out of them on the device, with no copy. ``ContextCache.alone`` gives a request a pool of its
own (``generate.py``, one request).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from engine_pod.device_buffers import DeviceBuffers, Floats
from engine_pod.kinds.canvas.context_layout import ContextLayout
from engine_pod.models.attention_rules import BIDIRECTIONAL, Masking, SdpaStyle
from engine_pod.models.forward_batch import ContextThenOwn, ForwardBatch, KeyLayout
from engine_pod.models.paged_kv import PagedKVPool
from engine_pod.models.ragged import RaggedAttention, RowSpans, starts_of

_GQA_MAX_HEAD_DIM = 256  # the reference lets SDPA group the heads only up to this width


class ContextConfig(Protocol):
    """A canvas model's config, as its context cache and stepper read it."""

    num_layers: int
    layer_kv_heads: tuple[int, ...]  # per layer: its K/V heads
    layer_head_dims: tuple[int, ...]  # per layer: their width
    sliding_window: int  # a sliding layer's query sees itself and the window - 1 keys before it
    canvas_length: int  # tokens denoised together: the kind's block
    vocab_size: int
    pad_token_id: int | None
    generation: dict[str, Any]  # the checkpoint's generation config: the sampler's settings

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends within the sliding window (else to the whole context)."""
        ...


def context_pool(
    config: ContextConfig, num_pages: int, page_size: int, dtype: torch.dtype, device: torch.device
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


def context_regions(config: ContextConfig, tokens: int, rows: int) -> dict[str, int]:
    """The regions ``ContextRows.of`` sends into, for a pool of ``tokens`` positions and up to ``rows`` rows:
    per reach its rows' kept counts and extents, then the new tokens' positions and slots and per reach its
    kept context's slots and places and the new tokens' places."""
    reaches = {
        config.sliding_window - 1 if config.is_sliding(layer) else None for layer in range(config.num_layers)
    }
    per_row = {f"{reach}/{name}": n * rows for reach in reaches for name, n in (("kept", 1), ("extents", 3))}
    lists = {f"{reach}/{name}": tokens for reach in reaches for name in ("slots", "context_at", "new_at")}
    return per_row | {"positions": tokens, "write_slots": tokens} | lists


def sdpa_style(head_dim: int) -> SdpaStyle:
    """How the reference calls SDPA in a layer of heads ``head_dim`` wide: scale 1 (the norms fix the
    logits' size), the grouped heads natively up to 256 wide where no mask is given."""
    return SdpaStyle(scale=1.0, native_gqa=head_dim <= _GQA_MAX_HEAD_DIM, head_major=True)


class ContextCache:
    """One request's context in the pool: ``length`` tokens encoded, their slots in position order."""

    def __init__(self, pool: PagedKVPool, owner: str, config: ContextConfig) -> None:
        self.pool, self.owner, self.config = pool, owner, config
        reach = config.sliding_window - 1
        # per layer: how many of the last context positions it attends to (None: all)
        self.reach = [reach if config.is_sliding(layer) else None for layer in range(config.num_layers)]
        self.length = 0  # context tokens encoded: the next token's position (its slots: the pool's table)

    @classmethod
    def alone(
        cls, config: ContextConfig, tokens: int, dtype: torch.dtype, device: torch.device
    ) -> ContextCache:
        """A request's context of up to ``tokens`` tokens, in a pool of its own."""
        page = config.canvas_length
        return cls(context_pool(config, -(-tokens // page), page, dtype, device), "alone", config)

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


class ContextRows:
    """The rows of one forward, row r over ``caches[r]`` (every cache in one pool) with ``tokens[r]`` new
    tokens: rows made by ``of`` (one copy to the device) or picked out of others by ``rows`` (none), and
    the ``ForwardBatch`` their forwards attend through (``forward``), its plans made once for all of them."""

    def __init__(
        self,
        caches: list[ContextCache],
        tokens: list[int],
        positions: torch.Tensor,
        layouts: dict[int | None, ContextLayout],
        write_slots: torch.Tensor | None = None,
        extra: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.caches, self.pool, self.tokens = caches, caches[0].pool, tokens
        self.positions, self.layouts, self.write_slots = positions, layouts, write_slots
        self.extra = extra or {}  # the caller's lists by name, sent in the rows' copy
        config = caches[0].config
        # a layer's group: its reach (its layout) and its heads' width (its SDPA style)
        self.layer_groups = list(zip(caches[0].reach, config.layer_head_dims))
        self.key_layouts = {group: self._key_layout(*group) for group in dict.fromkeys(self.layer_groups)}

    @classmethod
    def of(
        cls,
        caches: list[ContextCache],
        tokens: int | list[int],
        extra: dict[str, list[int] | Floats] | None = None,
        encoding: bool = False,
        buffers: DeviceBuffers | None = None,
    ) -> ContextRows:
        """The rows of ``caches`` with ``tokens`` new tokens each (one count: every row's), their positions,
        each reach's layout, where the new tokens go in the pool when ``encoding`` (the encoder's forward:
        the caches reserved them; else the decoder's, which writes nothing) and ``extra`` (the caller's
        lists, by name) sent to the device in one copy: into ``buffers`` (a runner's, whose regions keep
        their addresses from cycle to cycle; None: buffers of these rows alone)."""
        pool = caches[0].pool
        if any(cache.pool is not pool for cache in caches):
            raise ValueError("the rows of one forward must keep their contexts in one pool")
        tokens = [tokens] * len(caches) if isinstance(tokens, int) else list(tokens)
        reaches = sorted(set(caches[0].reach), key=lambda reach: (reach is None, reach or 0))
        spans = {reach: _spans(caches, tokens, reach) for reach in reaches}
        parts = {"positions": _positions(caches, tokens)}
        if encoding:
            parts["write_slots"] = _new_slots(caches, tokens)
        for reach in reaches:
            parts |= {
                f"{reach}/{name}": values
                for name, values in _layout_lists(caches, spans[reach], reach).items()
            }
        extra = extra or {}
        buffers = DeviceBuffers(pool.device) if buffers is None else buffers
        sent = buffers.send(parts | extra)  # the rows' one copy
        layouts = {
            reach: ContextLayout(spans[reach], **{name: sent[f"{reach}/{name}"] for name in LAYOUT_FIELDS})
            for reach in reaches
        }
        return cls(
            caches,
            tokens,
            sent["positions"],
            layouts,
            sent.get("write_slots"),
            {name: sent[name] for name in extra},
        )

    def forward(self, token_ids: torch.Tensor) -> ForwardBatch:
        """The forward of these rows' new tokens token_ids [R, T] (or [1, N], packed as the rows pack them)."""
        positions = self.positions.view(token_ids.shape)
        return ForwardBatch(
            token_ids,
            positions,
            self.key_layouts,
            self.pool,
            self.write_slots,
            layer_groups=self.layer_groups,
        )

    def rows(self, keep: list[int], index: torch.Tensor) -> ContextRows:
        """The decoder's rows ``keep`` alone (``index``: them on the device), laid out on the device from
        these: their keys stay where these rows pack them, nothing is copied from the host."""
        tokens = self.tokens[0]
        if self.write_slots is not None or any(count != tokens for count in self.tokens):
            raise ValueError("only the decoder's rows (one canvas each) can be picked out")
        return ContextRows(
            [self.caches[r] for r in keep],
            [tokens] * len(keep),
            self.positions.view(-1, tokens).index_select(0, index).flatten(),
            {reach: layout.rows(keep, index, tokens) for reach, layout in self.layouts.items()},
        )

    def _key_layout(self, reach: int | None, width: int) -> KeyLayout:
        """What the layers of one group attend over: row after row, the context they keep then the row's
        new tokens; the encoder causally (a sliding layer within its window), the decoder with no mask.
        The plan's varlen batch is derived on the device from the rows' copy."""
        layout, config = self.layouts[reach], self.caches[0].config
        if self.write_slots is None:
            masking = BIDIRECTIONAL
        else:
            masking = Masking(causal=True, window=None if reach is None else config.sliding_window)
        plan = RaggedAttention(layout.spans, self.pool.device, masking, sdpa_style(width), layout.varlen())
        return KeyLayout(plan, ContextThenOwn(layout.slots, layout.context_at, layout.new_at, layout.total))


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
