"""Where a head-sparse cycle keeps its entries: in pages of the runner's KV pool (models/paged_kv.py).

A page of the pool holds ``page_size`` positions of a layer's every K/V head (``page_size x Hkv`` entries
of ``head_dim`` values, keys and values alike). A head group keeps fewer positions than the dense cache,
each for its own ``Hg`` heads only, so the kept entries are laid in the pages by what is kept, not by
position: one run of consecutive pages per cycle, in which each layer's memory holds every group's
entries ``[n_g, Hg, head_dim]`` (``n_g`` the group's kept positions over the cycle's rows) one group after
another. The run is as many pages as those entries fill, sum over groups of ``n_g x Hg`` entries at
``Hkv`` per slot: a dense run's pages times the share the cache keeps, rounded up to a page. That is the
memory the head-sparse cache saves, and what a scheduler that charges a row the pages of what it keeps
(so that sparsity admits more rows) would count; a row carried across cycles could hold its part of them
as a dense carried row holds its pages (phase_carry.py).

Each group's entries of a layer are a view of the pool, no copy: the refresh writes the entries its heads
chose there, the window forwards rewrite the active block's entries there and attend over them.
"""

from __future__ import annotations

import torch

OWNER = "head-sparse"  # the run's owner in the runner's pool (one cycle at a time)


class KeptPages:
    """One cycle's kept entries: ``counts[g]`` entries of ``heads[g]`` heads per group, in every layer."""

    def __init__(self, pools, counts: list[int], heads: list[int], layers: int) -> None:
        """``pools``: the runner's CycleCachePool (cycle_cache.py), which reserves the run;
        ``heads``: each group's heads, together every K/V head of a layer (a slot's width)."""
        entries = [n * h for n, h in zip(counts, heads)]
        self.slots = max(1, -(-sum(entries) // sum(heads)))
        self.pool, self.base = pools.reserve_run(OWNER, self.slots)
        starts = [sum(entries[:g]) for g in range(len(entries))]
        self.keys = [self._views(self.pool.keys[layer], starts, counts, heads) for layer in range(layers)]
        self.values = [self._views(self.pool.values[layer], starts, counts, heads) for layer in range(layers)]

    def _views(self, stored: torch.Tensor, starts: list[int], counts: list[int], heads: list[int]):
        """Each group's entries [n_g, Hg, head_dim], views of the run's memory in ``stored``."""
        flat = stored[self.base : self.base + self.slots].view(-1, stored.shape[-1])
        return [flat[s : s + n * h].view(n, h, -1) for s, n, h in zip(starts, counts, heads)]

    def release(self) -> None:
        """Give the run back (the cycle ended)."""
        self.pool.release(OWNER)
