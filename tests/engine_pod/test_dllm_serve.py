"""dLLM-Serve's phase-multiplexed refreshes on the engine (runner/phase_cycle.py, scheduler/dllm_serve.py):
a quota spreads a cycle's refreshes over its steps and never changes a request's tokens (float64, greedy
and seeded sampling, LLaDA and Dream), and no step refreshes more than the quota."""

from __future__ import annotations

import random

import pytest

from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.decoding.sampling_params import SamplingParams
from engine_pod.engine import Engine
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.runner.phase_cycle import PhaseScheduleError
from engine_pod.scheduler.dllm_serve import DllmServeScheduler
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import common_token, run_workload
from tests.factories import REFERENCE_DIR, random_workload

BLOCK = 8
BUDGET = 400
DECODING = DecodingConfig(block_length=BLOCK, steps_per_block=4, cache="dual", canvas="block", threshold=0.6)


@pytest.fixture(scope="module")
def models():
    return {family: load_model(str(REFERENCE_DIR / family), dtype="float64") for family in ("llada", "dream")}


def _config(quota: float, interval: int = 0, **more) -> SchedulerConfig:
    return SchedulerConfig(
        token_budget=BUDGET, refresh_quota=quota, batch_refresh_quota=quota, refresh_interval=interval, **more
    )


def _sampling(workload, seed: int) -> dict[str, SamplingParams]:
    """Every other request sampled with its own seed, the rest greedy."""
    return {
        rid: SamplingParams(temperature=0.8, top_p=0.9, seed=seed + i)
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
        engine.add_request(engine.scheduler.request_for(rid, prompt, budget))
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
    cycle.add(cycle.request_for("a", [1, 2, 3], BLOCK))
    with pytest.raises(PhaseScheduleError, match="threshold"):
        runner.run(cycle.schedule())
