"""dLLM-Serve's phase-multiplexed cycles with the head-sparse cache: each request's tokens are those
BlockServe gives it with the same cache (float64, greedy), whatever the refresh quota and with blocks
carried from cycle to cycle; a refresh counts what it keeps, less than the dense cache."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.engine import Engine
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.dllm_serve import DllmServeScheduler
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import common_token, run_workload, tokens
from tests.factories import REFERENCE_DIR, random_workload

BLOCK, BUDGET = 8, 400


@pytest.fixture(scope="module")
def models():
    return {family: load_model(str(REFERENCE_DIR / family), dtype="float64") for family in ("llada", "dream")}


# dLLM-Serve's published selection: the mean query's pre-softmax logits, pooled over 3, after one full forward
AUTHORS = {"scoring": "mean-query-logit", "pool_kernel": 3, "selection_delay": 1}


def _sparse(mode: str, loaded, tmp_path) -> HeadSparseConfig:
    if mode == "uniform":
        return HeadSparseConfig(mode="uniform", retention=0.3)
    if mode.startswith("authors-"):  # authors-per-head, authors-shared
        selection = mode.removeprefix("authors-")
        return replace(_sparse("uniform", loaded, tmp_path), **AUTHORS, selection=selection)
    config = loaded.config  # head h of every layer scores h + 1: the last heads core, the first minor
    path = tmp_path / "importance.json"
    scores = [[h + 1.0 for h in range(config.num_heads)] for _ in range(config.num_layers)]
    path.write_text(json.dumps({"importance": scores}))
    return HeadSparseConfig(mode="head-centric", retention=0.3, minor_retention=0.1, importance=str(path))


def _config(quota: float, **more) -> SchedulerConfig:
    return SchedulerConfig(token_budget=BUDGET, refresh_quota=quota, batch_refresh_quota=quota, **more)


def _tokens(engine: Engine, workload) -> dict[str, list[int]]:
    for rid, prompt, budget in workload:
        engine.add_request(engine.scheduler.request_for(rid, prompt, tokens(budget)))
    generated: dict[str, list[int]] = {}
    engine.run(lambda r: generated.__setitem__(r.request_id, list(r.generated)))
    return generated


@pytest.mark.parametrize("mode", ["uniform", "head-centric", "authors-per-head", "authors-shared"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_dllm_serve_with_a_sparse_cache_answers_as_blockserve_with_it(models, family, mode, tmp_path):
    loaded = models[family]
    decoding = DecodingConfig(
        block_length=BLOCK,
        steps_per_block=4,
        cache="dual",
        threshold=0.6,
        sparse=_sparse(mode, loaded, tmp_path),
    )
    workload = random_workload(random.Random(7), 8, 480, BLOCK, max_prompt=30, max_blocks=4)
    alone = sequential_scheduler(BLOCK, [], ignore_eos=True, layout="packed")
    eos = [common_token(run_workload(loaded, alone, decoding, workload), 1)]  # rows leave at different blocks
    blockserve = BlockServeScheduler(BLOCK, eos, SchedulerConfig(token_budget=BUDGET))
    expected = run_workload(loaded, blockserve, decoding, workload)
    for quota in (1.0, 0.3, 0.16):  # the widest row (62) refreshes within 0.16 of 400
        engine = Engine(make_runner(loaded, decoding, BUDGET), DllmServeScheduler(BLOCK, eos, _config(quota)))
        assert _tokens(engine, workload) == expected, quota
        records = engine.records
        dense, kept = sum(r.kv_dense_bytes for r in records), sum(r.kv_kept_bytes for r in records)
        assert 0 < kept < dense, quota
        if quota < 1:
            assert any(r.carried for r in records), quota  # blocks went on from one cycle to the next
            assert max(r.peak_refresh_positions for r in records) <= int(quota * BUDGET)
    assert not engine.runner.stepper.carry.rows and not engine.runner.stepper.kept.of  # nothing left behind


def test_the_kept_entries_stay_in_pages_of_the_pool_while_a_row_refers_to_them(models):
    """Between cycles the pool holds exactly the pages of the stores a carried row refers to (each store a
    run of its own), their entries views of the pool's memory (after any growth); a store no row refers
    to gives its pages back, and nothing is held once every request is done."""
    loaded = models["llada"]
    decoding = DecodingConfig(
        block_length=BLOCK,
        steps_per_block=4,
        cache="dual",
        threshold=0.6,
        sparse=_sparse("uniform", loaded, None),
    )
    workload = random_workload(random.Random(7), 8, 480, BLOCK, max_prompt=30, max_blocks=4)
    engine = Engine(make_runner(loaded, decoding, BUDGET), DllmServeScheduler(BLOCK, [], _config(0.16)))
    stepper = engine.runner.stepper
    checked = []
    real_finish = stepper.finish

    def finish(state):
        output = real_finish(state)
        pool = stepper.cache_pool.pool
        stores = {id(store): store for store, _ in stepper.kept.of.values()}.values()
        held = {p for p in range(pool.capacity // pool.page_size) if pool.holders(p)}
        runs = [set(pool.table(store.pages.owner)) for store in stores]
        assert held == set().union(*runs) and sum(map(len, runs)) == len(held)
        views = [t for store in stores for layer in store.keys + store.values for t in layer]
        assert all(_in_pool(t, pool) for t in views)
        checked.append(len(runs))
        return output

    stepper.finish = finish
    _tokens(engine, workload)
    assert any(checked)  # some cycle carried rows with their stores
    pool = stepper.cache_pool.pool
    assert not stepper.kept.of and pool.free_pages * pool.page_size == pool.capacity


def _in_pool(view, pool) -> bool:
    """Whether ``view`` lies in one of the pool's layers' memory."""
    return any(
        view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in pool.keys + pool.values
    )
