"""The exact, persistent KV cache of block-diffusion models: pages of one pool, a page table per request.

A committed block's keys and values never change (attention is causal across blocks), so they are
written once and kept across block cycles. Each request holds the pages covering its committed
tokens plus its active block; the active block's entries are rewritten at every step until the block
is committed. Slots are flat (page x page_size + offset); the last slot is a scratch slot that padded
queries write to and padded keys read from, never attended.

Pages are reference-counted: a request's table holds one reference to each of its pages, and the block
prefix cache (kinds/block_causal/prefix_cache.py) one to each page it keeps, so that requests can share a
committed block's page and a finished request's blocks can outlive it. A page returns to the free list
when its last holder lets it go; when too few are free, ``reclaim`` (the cache's eviction) is asked first.

A page holds its positions in every layer; the layers' entries may differ in shape (``kv_heads`` and
``head_dim`` given per layer: DiffusionGemma's full-attention layers have fewer, wider heads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine_pod.device_buffers import DeviceBuffers
from engine_pod.host_bundle import to_device
from engine_pod.models.config import ModelConfig
from engine_pod.models.gather_scratch import GatherScratch


class PoolExhausted(RuntimeError):
    """The pool has fewer free pages than a request needs."""


class PagedKVPool:
    """Keys (after RoPE) and values of every layer, ``[slots + 1, kv_heads, head_dim]`` each (the layer's
    own heads and width where they are given per layer)."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        kv_heads: int | Sequence[int],
        head_dim: int | Sequence[int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError("a KV pool needs at least one page of at least one slot")
        self.page_size = page_size
        self.scratch = num_pages * page_size
        shapes = [(self.scratch + 1, h, d) for h, d in _per_layer(num_layers, kv_heads, head_dim)]
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        self.device = device
        self._free = list(range(num_pages - 1, -1, -1))
        self._refs = [0] * num_pages
        self._tables: dict[str, list[int]] = {}
        self.reclaim: Callable[[int], None] | None = None  # frees at least n pages if it can
        # the lists of the batches over this pool, sent in named regions (a runner sizes them: ``reserve``)
        self.buffers = DeviceBuffers(device)
        self.gather_scratch = GatherScratch()  # where forwards gather their keys and values on a CPU

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def reserve(self, owner: str, tokens: int) -> None:
        """Make ``owner``'s pages cover positions ``[0, tokens)``."""
        table = self._tables.setdefault(owner, [])
        needed = self.pages_for(tokens) - len(table)
        if needed > len(self._free) and self.reclaim is not None:
            self.reclaim(needed - len(self._free))
        if needed > len(self._free):
            raise PoolExhausted(f"{owner} needs {needed} more KV pages; {len(self._free)} are free")
        for _ in range(max(0, needed)):
            page = self._free.pop()
            self._refs[page] = 1
            table.append(page)

    def reserve_run(self, owner: str, tokens: int) -> int:
        """Consecutive pages for a new ``owner``'s positions ``[0, tokens)`` (the lowest free run): its first
        slot, position p's slot being that plus p (a dual cache's one cycle, read as one range)."""
        if self._tables.get(owner):
            raise ValueError(f"{owner} already holds pages; a run is reserved at once")
        needed, free = self.pages_for(tokens), sorted(self._free)
        first = next(
            (i for i in range(len(free) - needed + 1) if free[i + needed - 1] == free[i] + needed - 1), None
        )
        if first is None:
            raise PoolExhausted(f"{owner} needs {needed} consecutive KV pages; no run of them is free")
        run = free[first : first + needed]
        taken = set(run)
        self._free = [page for page in self._free if page not in taken]
        for page in run:
            self._refs[page] = 1
        self._tables[owner] = run
        return run[0] * self.page_size if run else 0

    @property
    def capacity(self) -> int:
        """Slots in the pool (the scratch slot excluded)."""
        return self.scratch

    def grow(self, num_pages: int) -> None:
        """At least ``num_pages`` pages: every layer's entries reallocated larger (one layer at a time), the
        held pages' entries kept in their slots (a page keeps its number, so every table and slot stays
        valid), the new pages free, handed out after the free ones."""
        pages = self.scratch // self.page_size
        if num_pages <= pages:
            return
        held = len(self._free) < pages
        size = num_pages * self.page_size
        for stores in (self.keys, self.values):
            for layer in range(len(stores)):
                old = stores[layer]
                shape, dtype, device = (size + 1, *old.shape[1:]), old.dtype, old.device
                kept = old[: self.scratch] if held else None  # nothing held: the old entries go first
                old = stores[layer] = None
                stores[layer] = torch.zeros(shape, dtype=dtype, device=device)
                if kept is not None:
                    stores[layer][: self.scratch] = kept
        self.scratch = size
        self._free = list(range(num_pages - 1, pages - 1, -1)) + self._free
        self._refs += [0] * (num_pages - pages)

    def share(self, owner: str, pages: list[int]) -> None:
        """Start ``owner``'s table (empty until now) with ``pages`` held by others (a cached prefix)."""
        if self._tables.get(owner):
            raise ValueError(f"{owner} already holds pages; shared pages go first")
        for page in pages:
            self.retain(page)
        self._tables[owner] = list(pages)

    def table(self, owner: str) -> list[int]:
        """``owner``'s pages, position order (empty when it holds none)."""
        return self._tables.get(owner, [])

    def retain(self, page: int) -> None:
        """One more holder of ``page`` (which must be held already)."""
        if self._refs[page] < 1:
            raise ValueError(f"page {page} is free; only a held page can be shared")
        self._refs[page] += 1

    def drop(self, page: int) -> None:
        """One holder fewer; the last one frees the page."""
        self._refs[page] -= 1
        if self._refs[page] == 0:
            self._free.append(page)

    def holders(self, page: int) -> int:
        return self._refs[page]

    def release(self, owner: str) -> None:
        """Let go of ``owner``'s pages (finished, cancelled or preempted); pages no one else holds are free."""
        for page in reversed(self._tables.pop(owner, [])):
            self.drop(page)

    def slots(self, owner: str, start: int, end: int) -> torch.Tensor:
        """Flat slots of positions ``[start, end)`` of ``owner`` (reserved beforehand)."""
        return self.flat_slots([(owner, start, end)])

    def flat_slots(self, spans: Sequence[tuple[str, int, int]]) -> torch.Tensor:
        """The slots of every ``(owner, start, end)``, one span after another: computed from the page
        tables on the host and sent to the device in one copy (one per batch, not one per request)."""
        return to_device(torch.tensor(self.host_slots(spans), dtype=torch.long), self.device)

    def host_slots(self, spans: Sequence[tuple[str, int, int]]) -> list[int]:
        """``flat_slots`` on the host, for a caller that sends them together with other lists."""
        flat: list[int] = []
        for owner, start, end in spans:
            flat.extend(self._flat_slots(self._tables[owner], start, end))
        return flat

    def _flat_slots(self, table: list[int], start: int, end: int) -> list[int]:
        """Position p's slot is table[p // page] * page + p % page: a run of consecutive slots per page."""
        size, out = self.page_size, []
        for index in range(start // size, -(-end // size)):
            shift = (table[index] - index) * size  # slot minus position on this page
            out.extend(range(shift + max(start, index * size), shift + min(end, (index + 1) * size)))
        return out

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keys and values [n, kv_heads, head_dim] of ``layer`` at ``slots`` [n]."""
        self.keys[layer].index_copy_(0, slots, keys)
        self.values[layer].index_copy_(0, slots, values)

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys) + sum(t.nbytes for t in self.values)


def _per_layer(
    num_layers: int, kv_heads: int | Sequence[int], head_dim: int | Sequence[int]
) -> list[tuple[int, int]]:
    """Each layer's (kv_heads, head_dim): one value stands for every layer."""
    heads = [kv_heads] * num_layers if isinstance(kv_heads, int) else list(kv_heads)
    dims = [head_dim] * num_layers if isinstance(head_dim, int) else list(head_dim)
    if len(heads) != num_layers or len(dims) != num_layers:
        raise ValueError(f"kv_heads and head_dim must be one value or one per layer ({num_layers})")
    return list(zip(heads, dims))


def model_pool(
    config: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device: torch.device
) -> PagedKVPool:
    """A pool for a model of ``config``'s layers and heads (every layer alike)."""
    return PagedKVPool(
        config.num_layers, num_pages, page_size, config.num_kv_heads, config.head_dim, dtype, device
    )
