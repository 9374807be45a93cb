"""The head-sparse dual cache on the shipped model: off is today's engine, retention 1 is the dense cache,
each head keeps ceil(r x context) + L entries of a row and window forwards read only those."""

from __future__ import annotations

import hashlib
import json
import math
from functools import partial

import pytest
import torch

from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig, DecodingConfigError
from engine_pod.kinds.bidirectional.head_sparse import hooks
from engine_pod.kinds.bidirectional.head_sparse import store as store_module
from engine_pod.loading.loader import load_model
from engine_pod.prompts import encode_prompt
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.synthetic.tasks import eval_set
from tests.engine_utils import run_workload

# sha256 of the workload's outputs from the engine before the head-sparse cache existed (threshold and
# low_confidence remasking): sparsity off must not change a bit of them
BEFORE = {
    "threshold": "0bbdf65a82dec6a35ff0ac58820040cd91116d96bdfb9c542d4420bb9c0d980b",
    "low_confidence": "865cb8e87b3058af3d9a90357cfa9eb1f0d5da009bca346dd444140afba1c998",
}


@pytest.fixture(scope="module")
def loaded():
    return load_model("builtin:tiny-llada")


@pytest.fixture(scope="module")
def workload(loaded):
    examples = eval_set(8, seed=7)
    return [
        (f"r{i}", encode_prompt(loaded.tokenizer, e.prompt, chat=True), 64) for i, e in enumerate(examples)
    ]


@pytest.fixture(scope="module")
def importance(tmp_path_factory):
    """A made-up importance file: head h of every layer scores h + 1 (head 5 core, head 0 minor)."""
    path = tmp_path_factory.mktemp("heads") / "importance.json"
    path.write_text(json.dumps({"importance": [[h + 1.0 for h in range(6)] for _ in range(4)]}))
    return str(path)


def _outputs(loaded, workload, decoding: DecodingConfig) -> dict[str, list[int]]:
    eos = loaded.config.eos_token_ids
    scheduler = partial(BlockServeScheduler, decoding.block_length, eos, SchedulerConfig(token_budget=4096))
    return run_workload(loaded, scheduler, decoding, workload)


def _sha(outputs: dict[str, list[int]]) -> str:
    return hashlib.sha256(json.dumps(sorted(outputs.items())).encode()).hexdigest()


@pytest.mark.parametrize("remasking", sorted(BEFORE))
def test_sparsity_off_gives_the_outputs_of_the_engine_before_it(loaded, workload, remasking):
    off = DecodingConfig(remasking=remasking, sparse=HeadSparseConfig(mode="off", retention=0.1))
    assert _sha(_outputs(loaded, workload, off)) == BEFORE[remasking]


def test_uniform_retention_one_gives_the_dense_cache_outputs(loaded, workload):
    dense = DecodingConfig(remasking="low_confidence")
    full = DecodingConfig(remasking="low_confidence", sparse=HeadSparseConfig(mode="uniform", retention=1.0))
    assert _outputs(loaded, workload, full) == _outputs(loaded, workload, dense)


def _window_reads(loaded, decoding, prompts, monkeypatch) -> tuple[list[tuple], object]:
    """Run one packed BlockServe-style cycle over ``prompts``; every window attention call of the head-sparse
    hooks as (query heads, each row's keys read, keys in the store)."""
    calls = []
    real = hooks.ragged_attention

    def spy(q, k, v, plan):
        calls.append((q.shape[1], list(plan.spans.k_len), k.shape[0]))
        return real(q, k, v, plan)

    monkeypatch.setattr(hooks, "ragged_attention", spy)
    runner = make_runner(loaded, decoding)
    rows = [CycleRow(tuple(p)) for p in prompts]
    output = runner.run(SchedulerOutput.of_rows(rows, gather_rows=False, packed=True))
    return calls, output


@pytest.mark.parametrize("retention", [0.1, 0.3, 0.5])
def test_uniform_heads_keep_ceil_r_context_plus_the_block_and_windows_read_only_those(
    loaded, workload, retention, monkeypatch
):
    prompts = [p for _, p, _ in workload[:3]]
    L = 32
    sparse = HeadSparseConfig(mode="uniform", retention=retention)
    calls, output = _window_reads(
        loaded, DecodingConfig(remasking="low_confidence", sparse=sparse), prompts, monkeypatch
    )
    kept = [math.ceil(retention * len(p)) + L for p in prompts]
    assert calls, "window forwards attend through the head-sparse hooks"
    per_layer = [c for c in calls if c[0] == 6 and len(c[1]) == len(prompts)]
    assert per_layer and all(sorted(c[1]) == sorted(kept) and c[2] == sum(kept) for c in per_layer)
    dense = sum(len(p) + L for p in prompts)
    assert output.stats.kv_dense_bytes == dense * 2 * 4 * 6 * 32 * 4
    assert output.stats.kv_kept_bytes == sum(kept) * 2 * 4 * 6 * 32 * 4


def test_head_centric_groups_read_their_own_counts_in_three_calls_per_layer(
    loaded, workload, importance, monkeypatch
):
    prompts = [p for _, p, _ in workload[:2]]
    sparse = HeadSparseConfig(mode="head-centric", retention=0.3, minor_retention=0.1, importance=importance)
    calls, _ = _window_reads(
        loaded, DecodingConfig(remasking="low_confidence", sparse=sparse), prompts, monkeypatch
    )
    expected = {
        (heads, tuple(sorted(math.ceil(r * len(p)) + 32 for p in prompts)))
        for heads, r in ((1, 1.0), (4, 0.3), (1, 0.1))
    }
    first_window = {(c[0], tuple(sorted(c[1]))) for c in calls[:3]}
    assert first_window == expected
    assert len(calls) % 3 == 0


@pytest.mark.parametrize("mode", ["uniform", "head-centric"])
def test_the_kept_entries_live_in_pages_of_the_pool_as_many_as_they_fill(
    loaded, workload, importance, mode, monkeypatch
):
    """The stores a window reads are views of the runner's pool, in a run of as many pages as the kept
    entries fill (the dense run's pages times the share kept, up to a page), given back at the cycle's end;
    no pool is sized for the budget up front."""
    seen = []
    real = store_module.CycleStore.finish

    def spy(store):
        pool = store.pages.pool
        views = [t for layer in store.keys + store.values for t in layer]
        seen.append(all(_same_memory(t, pool) for t in views))
        return real(store)

    monkeypatch.setattr(store_module.CycleStore, "finish", spy)
    sparse = HeadSparseConfig(mode=mode, retention=0.3, minor_retention=0.1, importance=importance)
    runner = make_runner(loaded, DecodingConfig(remasking="low_confidence", sparse=sparse), pool_tokens=4096)
    assert runner.stepper.cache_pool.pool is None
    rows = [CycleRow(tuple(p * 4)) for _, p, _ in workload[:3]]  # contexts long beside the block
    stats = runner.run(SchedulerOutput.of_rows(rows, packed=True)).stats
    pool, per_position = runner.stepper.cache_pool.pool, runner.stepper.position_bytes
    assert seen == [True]
    assert pool.free_pages * pool.page_size == pool.capacity  # nothing held after the cycle
    kept_slots = -(-stats.kv_kept_bytes // per_position)
    assert pool.capacity == -(-kept_slots // pool.page_size) * pool.page_size
    assert pool.capacity < stats.kv_dense_bytes // per_position


def _same_memory(view: torch.Tensor, pool) -> bool:
    """Whether ``view`` lies in one of the pool's layers' memory."""
    return any(
        view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in pool.keys + pool.values
    )


def test_the_dense_box_layout_is_refused_in_one_line(loaded):
    runner = make_runner(loaded, DecodingConfig(sparse=HeadSparseConfig(mode="uniform")))
    with pytest.raises(ValueError, match="packed rows only"):
        runner.run(SchedulerOutput.of_rows([CycleRow((5, 6, 7))], packed=False))


def test_other_cache_modes_and_families_are_refused():
    with pytest.raises(DecodingConfigError, match="needs cache 'dual'"):
        DecodingConfig(cache="prefix", sparse=HeadSparseConfig(mode="uniform"))
    block = load_model("builtin:tiny-llada2-random")
    with pytest.raises(ValueError, match="supports LLaDA and Dream"):
        make_runner(block, DecodingConfig(sparse=HeadSparseConfig(mode="uniform")))


def test_cross_step_consistency_keeps_a_similar_heads_previous_ranking():
    from engine_pod.kinds.bidirectional.head_sparse.scores import consistent_ranking

    previous = torch.tensor([[[0.5, 0.3, 0.2, 0.0]]])
    similar = torch.tensor([[[0.45, 0.35, 0.1, 0.1]]])
    different = torch.tensor([[[0.0, 0.1, 0.8, 0.1]]])
    length = torch.tensor([3])
    kept = consistent_ranking(similar, previous, length, 0.9)
    assert kept[0, 0, :3].tolist() == previous[0, 0, :3].tolist() and kept[0, 0, 3] == similar[0, 0, 3]
    assert torch.equal(consistent_ranking(different, previous, length, 0.9), different)
    assert torch.equal(consistent_ranking(similar, previous, length, 1.0), similar)


def test_dream_grouped_query_heads_at_retention_one_give_the_dense_cache_outputs():
    """Dream: two query heads per K/V head, logits shifted by one, the block's start committed at the
    refresh."""
    dream = load_model("random:dream-tiny")
    generator = torch.Generator().manual_seed(0)
    work = [
        (f"r{i}", torch.randint(5, 200, (n,), generator=generator).tolist(), 64)
        for i, n in enumerate([5, 40, 90])
    ]
    dense = DecodingConfig(remasking="low_confidence")
    full = DecodingConfig(remasking="low_confidence", sparse=HeadSparseConfig(mode="uniform", retention=1.0))
    assert _outputs(dream, work, full) == _outputs(dream, work, dense)
