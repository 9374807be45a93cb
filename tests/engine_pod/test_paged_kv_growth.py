"""A KV pool grows in place: held pages keep their numbers and entries (their tables and slots stay
valid), the new pages are free after the old free ones; a pool that holds nothing is reallocated."""

from __future__ import annotations

import torch

from engine_pod.models.paged_kv import PagedKVPool


def _pool(pages: int) -> PagedKVPool:
    return PagedKVPool(2, pages, 4, 2, 3, torch.float64, torch.device("cpu"))


def test_held_pages_keep_their_entries_and_numbers_when_the_pool_grows():
    pool = _pool(3)
    pool.reserve("a", 6)  # pages 0 and 1
    slots = pool.slots("a", 0, 6)
    keys = torch.arange(6 * 2 * 3, dtype=torch.float64).view(6, 2, 3)
    for layer in range(2):
        pool.write(layer, slots, keys + layer, -keys)
    pool.grow(7)
    assert pool.capacity == 28 and pool.free_pages == 5 and pool.table("a") == [0, 1]
    assert torch.equal(pool.slots("a", 0, 6), slots)
    for layer in range(2):
        assert torch.equal(pool.keys[layer][slots], keys + layer)
        assert torch.equal(pool.values[layer][slots], -keys)
        assert pool.keys[layer].shape == (29, 2, 3)
    pool.reserve("b", 4)  # the old free page first, then the new ones
    assert pool.table("b") == [2]
    assert pool.reserve_run("c", 16) == 12  # pages 3 to 6: a run of the new pages


def test_a_pool_holding_nothing_is_reallocated_and_smaller_sizes_change_nothing():
    pool = _pool(2)
    pool.grow(1)
    assert pool.capacity == 8
    pool.grow(5)
    assert pool.capacity == 20 and pool.free_pages == 5 and pool.reserve_run("a", 20) == 0
