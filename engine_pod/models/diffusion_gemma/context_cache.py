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

``ContextCache`` is one request's handle (its owner in the pool, its length, the slots of its positions);
``ContextBatch`` holds a forward's rows: it writes the encoder's new keys and values into their slots and,
for the decoder, reads every row's context of a layer in one gather, split into the groups of rows whose
context is equally wide there (the slots' layout is made once per batch: the runner keeps a batch over
the steps its rows take together).
``ContextCache.alone`` gives a request a pool of its own (``generate.py``, one request).
"""

from __future__ import annotations

import torch

from engine_pod.models.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.models.paged_kv import PagedKVPool

KV = tuple[torch.Tensor, torch.Tensor]
Group = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # row indices, context keys, values


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


def _split(
    keys: torch.Tensor, values: torch.Tensor, start: int, rows: int, kept: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Rows x kept gathered entries from ``start`` as [rows, Hkv, kept, hd] (None, None: no context)."""
    if not kept:
        return None, None
    span, shape = slice(start, start + rows * kept), (rows, kept, *keys.shape[1:])
    return keys[span].view(shape).transpose(1, 2), values[span].view(shape).transpose(1, 2)


class ContextCache:
    """One request's context in the pool: ``length`` tokens encoded, their slots in position order."""

    def __init__(self, pool: PagedKVPool, owner: str, config: DiffusionGemmaConfig) -> None:
        self.pool, self.owner = pool, owner
        reach = config.sliding_window - 1
        # per layer: how many of the last context positions it attends to (None: all)
        self.reach = [reach if config.is_sliding(layer) else None for layer in range(config.num_layers)]
        self.length = 0  # context tokens encoded: the next token's position
        self.slots = torch.empty(0, dtype=torch.long, device=pool.device)  # of positions [0, length)
        self.new_slots = self.slots  # of the positions being encoded (``reserve`` to ``advance``)

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
        self.new_slots = self.pool.slots(self.owner, self.length, self.length + tokens)

    def read(self, layer: int) -> KV | None:
        """The context keys/values [1, Hkv, kept, hd] that ``layer`` attends to (None: none yet)."""
        slots = self.slots[self.start(layer) :]
        if not len(slots):
            return None
        keys, values = self.pool.keys[layer], self.pool.values[layer]
        return (
            keys.index_select(0, slots).transpose(0, 1)[None],
            values.index_select(0, slots).transpose(0, 1)[None],
        )

    def advance(self, tokens: int) -> None:
        """Record that the encoder has written the ``tokens`` reserved last in every layer."""
        self.slots = torch.cat([self.slots, self.new_slots])
        self.length += tokens

    def release(self) -> None:
        """Give the pages back (the request finished, left or is re-encoded): the context is empty."""
        self.pool.release(self.owner)
        self.length = 0
        self.slots = self.new_slots = self.slots[:0]


class ContextBatch:
    """The rows of one forward, row r over ``caches[r]`` (every cache in one pool)."""

    def __init__(self, caches: list[ContextCache]) -> None:
        self.caches = caches
        self.pool = caches[0].pool
        if any(cache.pool is not self.pool for cache in caches):
            raise ValueError("the rows of one forward must keep their contexts in one pool")
        self._layouts: dict[int | None, tuple[list[tuple[torch.Tensor, int, int]], torch.Tensor]] = {}

    def positions(self, tokens: int, device: torch.device) -> torch.Tensor:
        """[R, T]: row r's tokens continue its context (positions caches[r].length..)."""
        lengths = torch.tensor([cache.length for cache in self.caches], device=device)
        return torch.arange(tokens, device=device) + lengths[:, None]

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The new context tokens' keys/values [R, Hkv, T, hd] into the slots each row reserved."""
        slots = torch.cat([cache.new_slots for cache in self.caches])
        self.pool.keys[layer].index_copy_(0, slots, keys.transpose(1, 2).flatten(0, 1))
        self.pool.values[layer].index_copy_(0, slots, values.transpose(1, 2).flatten(0, 1))

    def context(self, layer: int) -> list[Group]:
        """The rows grouped by how many context tokens ``layer`` attends to: each group's row indices and
        its context's keys and values [rows, Hkv, kept, hd] (None: no context yet), every group's read
        from the pool in one gather per layer."""
        groups, slots = self._layout(layer)
        keys, values = self.pool.keys[layer], self.pool.values[layer]
        if slots.numel():
            keys, values = keys.index_select(0, slots), values.index_select(0, slots)
        return [(index, *_split(keys, values, start, len(index), kept)) for index, start, kept in groups]

    def _layout(self, layer: int) -> tuple[list[tuple[torch.Tensor, int, int]], torch.Tensor]:
        """Per group: its row indices, where its slots start in the flat slots, its width; and the flat
        slots, group after group and row after row. Layers of one reach share them."""
        reach = self.caches[0].reach[layer]
        if reach not in self._layouts:
            by_width: dict[int, list[int]] = {}
            for row, cache in enumerate(self.caches):
                by_width.setdefault(cache.kept(layer), []).append(row)
            device, groups, slots, start = self.pool.device, [], [], 0
            for kept, rows in by_width.items():
                groups.append((torch.tensor(rows, device=device), start, kept))
                slots += [self.caches[r].slots[self.caches[r].start(layer) :] for r in rows]
                start += kept * len(rows)
            self._layouts[reach] = (groups, torch.cat(slots))
        return self._layouts[reach]
