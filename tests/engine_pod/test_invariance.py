"""Batching never changes a request's greedy output (float64, so no rounding can flip a decision).

Random workloads vary prompt lengths, generation budgets, early EOS, arrival order, token budgets,
static batch sizes, decoding policy, cache mode, canvas and layout (packed or dense); every request's
tokens must equal the tokens it gets alone in a dense box of one row.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_contracts.scheduler_config import LAYOUTS, SchedulerConfig
from engine_pod.decoding.config import REMASKING, DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.static import StaticScheduler, sequential_scheduler
from tests.engine_utils import common_token, run_workload
from tests.factories import REFERENCE_DIR, random_workload

BLOCK = 8


@pytest.fixture(scope="module")
def models():
    return {family: load_model(str(REFERENCE_DIR / family), dtype="float64") for family in ("llada", "dream")}


workloads = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "family": st.sampled_from(["llada", "dream"]),
        "requests": st.integers(2, 10),
        "threshold": st.sampled_from([0.3, 0.6, 0.9]),
        "cache": st.sampled_from(["none", "prefix", "dual"]),
        "masked_suffix": st.booleans(),
        "budget_slack": st.integers(0, 200),
        "admission": st.sampled_from(["preempt", "projected"]),
        "static_batch": st.integers(1, 6),
        "eos_rank": st.integers(0, 6),
        "layout": st.sampled_from(LAYOUTS),
    }
)


EXAMPLES = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# every remasking policy (maskgit_plus included) on CI's 3 examples each (replayed: the same every run);
# the slow variant below searches 40 each
@pytest.mark.parametrize("remasking", REMASKING)
@settings(max_examples=3, **EXAMPLES)
@given(case=workloads)
def test_output_is_independent_of_the_batch(models, remasking, case):
    _check_independent_of_the_batch(models, case | {"remasking": remasking})


@pytest.mark.slow
@pytest.mark.parametrize("remasking", REMASKING)
@settings(max_examples=40, **EXAMPLES)
@given(case=workloads)
def test_output_is_independent_of_the_batch_over_many_workloads(models, remasking, case):
    _check_independent_of_the_batch(models, case | {"remasking": remasking})


def _check_independent_of_the_batch(models, case: dict) -> None:
    """A request's tokens from BlockServe's and static batches of ``case``'s workload are its tokens alone."""
    rng = random.Random(case["seed"])
    workload = random_workload(rng, case["requests"], 480, BLOCK, max_prompt=30, max_blocks=4)
    decoding = DecodingConfig(
        block_length=BLOCK,
        steps_per_block=4,
        remasking=case["remasking"],
        threshold=case["threshold"],
        cache=case["cache"],
        masked_suffix=case["masked_suffix"],
    )
    loaded = models[case["family"]]
    dense_alone = dict(masked_suffix=case["masked_suffix"], layout="dense")
    free = run_workload(
        loaded, sequential_scheduler(BLOCK, [], ignore_eos=True, **dense_alone), decoding, workload
    )
    eos = [common_token(free, case["eos_rank"])]
    alone = run_workload(loaded, sequential_scheduler(BLOCK, eos, **dense_alone), decoding, workload)
    peak = max(len(p) + g for _, p, g in workload)
    budget = peak + case["budget_slack"]
    order = list(range(len(workload)))
    rng.shuffle(order)
    scheduling = SchedulerConfig(token_budget=budget, admission=case["admission"], layout=case["layout"])
    blockserve = BlockServeScheduler(BLOCK, eos, scheduling, masked_suffix=case["masked_suffix"])
    static = StaticScheduler(
        BLOCK,
        eos,
        batch_size=case["static_batch"],
        masked_suffix=case["masked_suffix"],
        layout=case["layout"],
    )
    assert run_workload(loaded, blockserve, decoding, workload, order) == alone
    assert run_workload(loaded, static, decoding, workload, order) == alone


def test_early_eos_really_happens_in_these_workloads(models):
    """Guard against a vacuous property: EOS does cut some requests short."""
    workload = random_workload(random.Random(7), 10, 480, BLOCK, max_blocks=4)
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=4, cache="dual")
    loaded = models["llada"]
    free = run_workload(loaded, sequential_scheduler(BLOCK, [], ignore_eos=True), decoding, workload)
    eos = [common_token(free, 0)]
    alone = run_workload(loaded, sequential_scheduler(BLOCK, eos), decoding, workload)
    budgets = {rid: budget for rid, _, budget in workload}
    assert any(len(tokens) < budgets[rid] for rid, tokens in alone.items())
