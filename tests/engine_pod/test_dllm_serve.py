"""dLLM-Serve on the engine (kinds/bidirectional/phase_stepper.py, kinds/bidirectional/phase_carry.py, scheduler/dllm_serve.py): a quota
spreads a cycle's refreshes over its steps and never changes a request's tokens (float64, greedy and seeded
sampling, LLaDA and Dream), and no step refreshes more than the quota; step-level batching ends a cycle at
the step after which a row's block is complete, the rows going on carry their blocks, counters and caches
into the next cycle, and every request still gets the tokens (and log probabilities) it gets alone, rows
leaving at different blocks, a request cancelled or preempted while its block is carried."""

from __future__ import annotations

import random

import pytest

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.engine import Engine
from engine_pod.kinds.bidirectional.phase_stepper import PhaseScheduleError
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.dllm_serve import DllmServeScheduler
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import common_token, run_workload, tokens
from tests.factories import REFERENCE_DIR, random_workload

BLOCK = 8
BUDGET = 400
DECODING = DecodingConfig(block_length=BLOCK, steps_per_block=4, cache="dual", threshold=0.6)


@pytest.fixture(scope="module")
def models():
    return {family: load_model(str(REFERENCE_DIR / family), dtype="float64") for family in ("llada", "dream")}


def _config(quota: float, interval: int = 0, **more) -> SchedulerConfig:
    return SchedulerConfig(
        token_budget=BUDGET, refresh_quota=quota, batch_refresh_quota=quota, refresh_interval=interval, **more
    )


def _sampling(workload, seed: int) -> dict[str, RequestParams]:
    """Every other request sampled with its own seed, the rest greedy."""
    return {
        rid: RequestParams(temperature=0.8, top_p=0.9, seed=seed + i)
        for i, (rid, _, _) in enumerate(workload)
        if i % 2
    }


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("seed", [3, 11])
def test_a_quota_never_changes_a_requests_tokens(models, family, seed):
    loaded = models[family]
    workload = random_workload(random.Random(seed), 8, 480, BLOCK, max_prompt=30, max_blocks=4)
    sampling = _sampling(workload, seed)
    free = run_workload(loaded, sequential_scheduler(BLOCK, [], ignore_eos=True), DECODING, workload)
    eos = [common_token(free, 1)]  # rows leave at different blocks
    alone = run_workload(
        loaded, sequential_scheduler(BLOCK, eos, layout="dense"), DECODING, workload, sampling=sampling
    )
    for quota in (1.0, 0.3, 0.16):  # the widest row (62) refreshes within 0.16 of 400
        scheduler = DllmServeScheduler(BLOCK, eos, _config(quota))
        assert run_workload(loaded, scheduler, DECODING, workload, sampling=sampling) == alone, quota


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_refresh_interval_gives_each_request_its_tokens_alone(models, family):
    loaded = models[family]
    workload = random_workload(random.Random(5), 6, 480, BLOCK, max_prompt=30, max_blocks=3)
    sampling = _sampling(workload, 5)
    alone_config = _config(1.0, interval=2, max_rows=1)
    alone = run_workload(
        loaded,
        DllmServeScheduler(BLOCK, [], alone_config, ignore_eos=True),
        DECODING,
        workload,
        sampling=sampling,
    )
    batched = DllmServeScheduler(BLOCK, [], _config(0.15, interval=2), ignore_eos=True)
    assert run_workload(loaded, batched, DECODING, workload, sampling=sampling) == alone
    plain = run_workload(
        loaded, DllmServeScheduler(BLOCK, [], _config(1.0), ignore_eos=True), DECODING, workload
    )
    assert plain != alone  # the interval really refreshes mid-block (greedy rows differ somewhere)


def _records(loaded, config: SchedulerConfig, workload):
    runner = make_runner(loaded, DECODING, BUDGET)
    engine = Engine(runner, DllmServeScheduler(BLOCK, [], config, ignore_eos=True))
    for rid, prompt, budget in workload:
        engine.add_request(engine.scheduler.request_for(rid, prompt, tokens(budget)))
    engine.run()
    return list(engine.records)


def test_no_step_refreshes_more_than_the_quota_and_refreshes_are_spread(models):
    workload = random_workload(random.Random(9), 8, 480, BLOCK, max_prompt=30, max_blocks=3)
    quota = 0.15
    records = _records(models["llada"], _config(quota), workload)
    limit = int(quota * BUDGET)
    assert all(r.refresh_quota == limit for r in records)
    assert max(r.peak_refresh_positions for r in records) <= limit
    # a cycle whose rows' widths pass the quota refreshes them over several steps
    assert any(r.refresh_positions > limit for r in records)
    unlimited = _records(models["llada"], _config(1.0), workload)
    assert max(r.peak_refresh_positions for r in unlimited) > limit  # without the quota, one step would


def test_a_policy_that_counts_steps_is_refused_in_one_line(models):
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=4, cache="dual", remasking="low_confidence")
    runner = make_runner(models["llada"], decoding, BUDGET)
    assert not runner.staggers_refreshes
    with pytest.raises(
        ValueError, match="--remasking threshold, not LLaDA with --cache dual and --remasking low"
    ):
        Engine(runner, DllmServeScheduler(BLOCK, [], _config(0.5), ignore_eos=True))
    # a cycle that asks anyway (no engine between) is refused by the runner
    cycle = DllmServeScheduler(BLOCK, [], _config(0.5))
    cycle.add(cycle.request_for("a", [1, 2, 3], tokens(BLOCK)))
    with pytest.raises(PhaseScheduleError, match="threshold"):
        runner.run(cycle.schedule())


def _engine(loaded, eos, config: SchedulerConfig, workload, sampling=None, logprobs=None) -> Engine:
    engine = Engine(make_runner(loaded, DECODING, BUDGET), DllmServeScheduler(BLOCK, eos, config))
    for rid, prompt, budget in workload:
        params = tokens(budget, (sampling or {}).get(rid), logprobs=(logprobs or {}).get(rid))
        engine.add_request(engine.scheduler.request_for(rid, prompt, params))
    return engine


def _finish(engine: Engine) -> tuple[dict[str, list[int]], dict[str, list]]:
    """Step to the end: each request's tokens, and the log probabilities of those that asked."""
    tokens, values = {}, {}
    while engine.has_work():
        result = engine.step()
        _carried_entries_are_in_the_pool(engine.runner.stepper)
        for rid, block, kept in zip(result.output.request_ids, result.blocks, result.logprobs or []):
            if block is not None and kept is not None:
                values.setdefault(rid, []).extend(kept)
        tokens.update({r.request_id: list(r.generated) for r in result.finished})
    return tokens, values


def _carried_entries_are_in_the_pool(stepper) -> None:
    """Between cycles the pool holds nothing but the pages under the carried rows' entries, each once."""
    carry, pool = stepper.carry, stepper.cache_pool.pool
    pages = pool.capacity // pool.page_size
    if not carry.rows:
        assert not carry.pages and pool.free_pages == pages
        return
    assert carry.pool is pool and carry.pages and pool.free_pages == pages - len(carry.pages)
    assert all(pool.holders(page) == 1 for page in carry.pages)
    size = pool.page_size
    for row in carry.rows.values():  # every entry's page is held
        assert {s // size for s in range(row.kv_at, row.kv_at + row.kv_len)} <= set(carry.pages)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_rows_carry_their_blocks_across_cycles_and_get_their_tokens_alone(models, family):
    loaded = models[family]
    workload = random_workload(random.Random(7), 8, 480, BLOCK, max_prompt=30, max_blocks=4)
    sampling = {
        rid: RequestParams(temperature=0.8, seed=i) for i, (rid, _, _) in enumerate(workload) if i % 2
    }
    free = run_workload(loaded, sequential_scheduler(BLOCK, [], ignore_eos=True), DECODING, workload)
    eos = [common_token(free, 1)]  # rows leave at different blocks
    alone = run_workload(
        loaded, sequential_scheduler(BLOCK, eos, layout="dense"), DECODING, workload, sampling=sampling
    )
    engine = _engine(loaded, eos, _config(0.3), workload, sampling)
    tokens, _ = _finish(engine)
    assert tokens == alone
    carried = [record.carried for record in engine.records]
    assert sum(1 for c in carried if c) >= 2  # cycles really ended at a step with rows going on
    assert not engine.runner.stepper.carry.rows  # nothing is left carried at the end
    block_level = _engine(loaded, eos, _config(0.3, step_level=False), workload, sampling)
    assert _finish(block_level)[0] == alone
    assert not any(record.carried for record in block_level.records)
    assert len(engine.records) > len(block_level.records)


def test_log_probabilities_carried_with_a_block_are_those_alone(models):
    loaded = models["dream"]
    workload = random_workload(random.Random(4), 6, 480, BLOCK, max_prompt=24, max_blocks=3)
    ids = [rid for rid, _, _ in workload]
    asked = {ids[0]: 2, ids[2]: 0, ids[3]: 3}
    sampling = {ids[3]: RequestParams(temperature=1.0, top_k=5, seed=3)}
    batched = _engine(loaded, [], _config(0.3), workload, sampling, asked)
    _, values = _finish(batched)
    assert any(record.carried for record in batched.records)
    for rid in asked:
        solo = _engine(loaded, [], _config(0.3), [w for w in workload if w[0] == rid], sampling, asked)
        _, alone = _finish(solo)
        assert [(round(lp, 9), [i for i, _ in alt]) for lp, alt in values[rid]] == [
            (round(lp, 9), [i for i, _ in alt]) for lp, alt in alone[rid]
        ]


def test_a_request_cancelled_while_its_block_is_carried_leaves_nothing_behind(models):
    loaded = models["llada"]
    workload = random_workload(random.Random(8), 6, 480, BLOCK, max_prompt=30, max_blocks=4)
    alone = run_workload(loaded, sequential_scheduler(BLOCK, [], ignore_eos=True), DECODING, workload)
    engine = _engine(loaded, [], _config(0.3), workload)
    engine.scheduler.ignore_eos = True
    gone = None
    while gone is None and engine.has_work():
        result = engine.step()
        gone = next(
            (rid for rid, block in zip(result.output.request_ids, result.blocks) if block is None), None
        )
    assert gone is not None and gone in engine.runner.stepper.carry.rows
    engine.scheduler.cancel(gone)
    tokens, _ = _finish(engine)
    assert gone not in tokens and gone not in engine.runner.stepper.carry.rows
    assert tokens == {rid: t for rid, t in alone.items() if rid in tokens}
    assert len(tokens) == len(workload) - 1


def test_rows_preempted_with_a_carried_block_start_it_again_and_get_their_tokens_alone(models):
    loaded = models["llada"]
    workload = random_workload(random.Random(2), 8, 480, BLOCK, max_prompt=30, max_blocks=5)
    alone = run_workload(loaded, sequential_scheduler(BLOCK, [], ignore_eos=True), DECODING, workload)
    config = SchedulerConfig(
        token_budget=200, refresh_quota=0.6, batch_refresh_quota=0.6, admission="preempt"
    )
    engine = _engine(loaded, [], config, workload)
    engine.scheduler.ignore_eos = True
    assert _finish(engine)[0] == alone
    assert sum(record.preempted for record in engine.records) >= 2
    assert sum(1 for record in engine.records if record.carried) >= 2
