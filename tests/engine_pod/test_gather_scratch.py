"""The pool's gather buffers (engine_pod/models/gather_scratch.py): a forward's keys and values gathered from
the pool on a CPU are the pool's entries at their slots, in two buffers taken in turn (a layer's keys and
values never share memory), reused from forward to forward rather than allocated at every gather."""

from __future__ import annotations

import torch

from engine_pod.models.forward_batch import PoolSlots
from engine_pod.models.paged_kv import PagedKVPool


def _pool(dtype=torch.float32) -> PagedKVPool:
    pool = PagedKVPool(2, 64, 16, 2, 8, dtype, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    for stores in (pool.keys, pool.values):
        for layer in stores:
            layer.copy_(torch.randn(layer.shape, generator=generator, dtype=dtype))
    return pool


def test_a_layers_keys_and_values_are_the_pools_entries_in_buffers_of_their_own():
    pool = _pool()
    slots = torch.tensor([5, 900, 17, 18, 19, 3, 1023])
    source = PoolSlots(slots, pool.gather_scratch)
    for layer in range(2):
        keys = source.read(pool.keys[layer], torch.empty(0))
        values = source.read(pool.values[layer], torch.empty(0))
        assert torch.equal(keys, pool.keys[layer].index_select(0, slots))
        assert torch.equal(values, pool.values[layer].index_select(0, slots))
        assert keys.untyped_storage().data_ptr() != values.untyped_storage().data_ptr()


def test_gathers_reuse_their_buffers_and_grow_for_more_slots():
    pool = _pool()
    scratch = pool.gather_scratch
    first = [scratch.gather(pool.keys[0], torch.arange(40)), scratch.gather(pool.values[0], torch.arange(40))]
    again = [scratch.gather(pool.keys[1], torch.arange(10)), scratch.gather(pool.values[1], torch.arange(10))]
    assert [t.data_ptr() for t in again] == [t.data_ptr() for t in first]  # nothing allocated
    more = torch.arange(300, 1000)
    keys, values = scratch.gather(pool.keys[1], more), scratch.gather(pool.values[1], more)
    assert torch.equal(keys, pool.keys[1][300:1000]) and torch.equal(values, pool.values[1][300:1000])
    wider = _pool(torch.float64)  # another dtype: buffers of its own
    assert torch.equal(scratch.gather(wider.keys[0], more), wider.keys[0][300:1000])
