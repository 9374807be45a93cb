"""Where a head-sparse cycle keeps its entries: in pages of the runner's KV pool (models/paged_kv.py).

A page of the pool holds ``page_size`` positions of a layer's every K/V head (``page_size x Hkv`` entries
of ``head_dim`` values, keys and values alike). A head group keeps fewer positions than the dense cache,
each for its own ``Hg`` heads only, so the kept entries are laid in the pages by what is kept, not by
position: one run of consecutive pages per cycle, in which each layer's memory holds every group's
entries ``[n_g, Hg, head_dim]`` (``n_g`` the group's kept positions over the cycle's rows) one group after
another. The run is as many pages as those entries fill, sum over groups of ``n_g x Hg`` entries at
``Hkv`` per slot: a dense run's pages times the share the cache keeps, rounded up to a page. That is the
memory the head-sparse cache saves, and what a scheduler that charges a row the pages of what it keeps
(so that sparsity admits more rows) would count. A block cycle's run is given back at its end; under
dLLM-Serve's phases (phase_sparse.py) each step's refresh has a run of its own, held while a row refers to
it, across cycles for a carried row.

Each group's entries of a layer are a view of the pool, no copy (made again where the pool grew): the refresh writes the entries its heads
chose there, the window forwards rewrite the active block's entries there and attend over them.
"""

from __future__ import annotations

import torch

OWNER = "head-sparse"  # a block cycle's run in the runner's pool (one at a time; phase stores name their own)


class KeptPages:
    """Kept entries: ``counts[g]`` entries of ``heads[g]`` heads per group, in every layer, in one run of
    pages held by ``owner`` until ``release``."""

    def __init__(self, pools, counts: list[int], heads: list[int], layers: int, owner: str = OWNER) -> None:
        """``pools``: the runner's CycleCachePool (cycle_cache.py), which reserves the run;
        ``heads``: each group's heads, together every K/V head of a layer (a slot's width)."""
        entries = [n * h for n, h in zip(counts, heads)]
        self.slots = max(1, -(-sum(entries) // sum(heads)))
        self.owner, self.counts, self.heads, self.layers = owner, counts, heads, layers
        self.starts = [sum(entries[:g]) for g in range(len(entries))]
        self.pool, self.base = pools.reserve_run(owner, self.slots)
        self._source: torch.Tensor | None = None  # the pool's memory the views were made of

    @property
    def keys(self) -> list[list[torch.Tensor]]:
        self._follow_pool()
        return self._keys

    @property
    def values(self) -> list[list[torch.Tensor]]:
        self._follow_pool()
        return self._values

    def _follow_pool(self) -> None:
        """The views made again where the pool grew since (it reallocates its memory, held pages' entries
        kept in their slots): the entries are always read and written in the pool itself."""
        if self._source is self.pool.keys[0]:
            return
        pool = self.pool
        self._keys = [self._views(pool.keys[layer]) for layer in range(self.layers)]
        self._values = [self._views(pool.values[layer]) for layer in range(self.layers)]
        self._source = pool.keys[0]

    def _views(self, stored: torch.Tensor) -> list[torch.Tensor]:
        """Each group's entries [n_g, Hg, head_dim], views of the run's memory in ``stored``."""
        flat = stored[self.base : self.base + self.slots].view(-1, stored.shape[-1])
        return [flat[s : s + n * h].view(n, h, -1) for s, n, h in zip(self.starts, self.counts, self.heads)]

    def release(self) -> None:
        """Give the run back (nothing refers to its entries any more)."""
        self.pool.release(self.owner)
