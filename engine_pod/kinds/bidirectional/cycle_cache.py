"""A block cycle's dual cache (Fast-dLLM): the keys and values of every position of the cycle's rows,
computed by the cycle's first forward (the refresh) and read by its window forwards, which rewrite their
own positions' entries first.

They live in the runner's KV pool (models/paged_kv.py, the one KV store of every family) as one run of
consecutive pages that the refresh reserves and the cycle's end gives back: nothing is kept across cycles
(the next cycle's refresh recomputes every key, as the dual cache prescribes), except where a cycle ends
with rows going on (dLLM-Serve's step-level batching): their pages stay held until the next cycle has
copied their entries into its run (phase_carry.py). A position's slot is the run's first slot plus its
place in the run:
- packed rows: row r's keys one after another from ``row_start[r]`` (``slot_of`` maps box columns to
  places; packing.py);
- a dense box: row r's ``W + 1`` box columns from ``r (W + 1)``, the last a scratch column that window
  padding writes and no query attends (box_batches.py).

Under the head-sparse cache (head_sparse/, packed rows only) the cycle reserves no dense run: the refresh
keeps each head group's chosen entries in compact stores (``store``), which the windows read, in a run of
the same pool as many pages long as what is kept (head_sparse/kept_pages.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine_pod.models.paged_kv import PagedKVPool, PoolExhausted

OWNER = "cycle-cache"  # the run's owner in the runner's pool (one cycle at a time)


class CycleCache:
    """One cycle's dual cache: its run in the pool, and where each row's positions are in it."""

    def __init__(self, pools: CycleCachePool | None, heads=None, owner: str = OWNER) -> None:
        self.pools = pools  # where its run is reserved; None: no pool
        self.owner = owner  # its run's owner in the pool (a split refresh's run is its request's)
        self.heads = heads  # head-sparse: the runner's HeadSparse (head_sparse/store.py)
        self.store = None  # head-sparse: this cycle's CycleStore, made by the refresh
        self.owners: list[str] = []  # head-sparse: the request behind each row
        self.pool: PagedKVPool | None = None
        self.base = 0  # the run's first slot
        self.total = 0  # places in the run
        # packed: each box column's place (``total``: not cached), each row's keys, host and device
        self.slot_of: torch.Tensor | None = None
        self.row_start: list[int] = []
        self.row_len: list[int] = []
        self.row_start_on_device: torch.Tensor | None = None
        self.row_len_on_device: torch.Tensor | None = None
        # dense: the box's row width (W + 1) and which of its keys attention may see [R, W + 1]
        self.row_width = 0
        self.key_mask: torch.Tensor | None = None

    def reserve(self, places: int) -> None:
        """The run for ``places`` positions (the refresh's), its first slot ``base``."""
        self.release()
        if self.pools is None or self.heads is not None:  # head-sparse: its stores hold what is kept
            self.base, self.total = 0, places
            return
        self.pool, self.base = self.pools.reserve_run(self.owner, places)
        self.total = places

    def release(self) -> None:
        """Give the run back (the cycle ended)."""
        if self.store is not None:
            self.store.release()
        self.store = None
        if self.pool is not None:
            self.pool.release(self.owner)
            self.pool = None

    def set_packed_layout(
        self,
        slot_of: torch.Tensor,
        row_start: list[int],
        row_len: list[int],
        row_start_on_device: torch.Tensor,
        row_len_on_device: torch.Tensor,
    ) -> None:
        self.slot_of, self.row_start, self.row_len = slot_of, row_start, row_len
        self.row_start_on_device, self.row_len_on_device = row_start_on_device, row_len_on_device

    def count_bytes(self, stats, position_bytes: int) -> None:
        """A refresh's cache in a cycle's stats (CycleStats): the dense cache's bytes, and what it keeps."""
        dense = self.total * position_bytes
        stats.kv_dense_bytes += dense
        stats.kv_kept_bytes += self.store.kept_bytes() if self.store is not None else dense

    def slots(self, places: torch.Tensor) -> torch.Tensor:
        """The pool slots of these places in the run."""
        return places + self.base if self.base else places


class CycleCachePool:
    """The runner's pool for its cycles' caches: one pool, sized first for ``initial`` places (where the
    budget is known), grown when a cycle's run finds no room: to the run's size where the pool holds
    nothing (nothing moves), else by the run's pages, the held pages' entries kept in place (a carried
    row's: phase_carry.py)."""

    def __init__(self, new_pool: Callable[[int], PagedKVPool], page_size: int, initial: int | None) -> None:
        self.new_pool, self.page_size = new_pool, page_size
        self.pool: PagedKVPool | None = None
        if initial:
            self.pool = new_pool(self._pages(initial))

    def _pages(self, places: int) -> int:
        return -(-max(places, 1) // self.page_size)

    def reserve_run(self, owner: str, places: int) -> tuple[PagedKVPool, int]:
        """The pool and the first slot of ``owner``'s new run of ``places`` positions."""
        pages = self._pages(places)
        if self.pool is None:
            self.pool = self.new_pool(pages)
        try:
            return self.pool, self.pool.reserve_run(owner, places)
        except PoolExhausted:
            total = self.pool.capacity // self.page_size
            self.pool.grow(pages if self.pool.free_pages == total else total + pages)
            return self.pool, self.pool.reserve_run(owner, places)
