"""DiffusionGemma's batching contract (kinds/canvas/stepper.py), in float64 where no rounding can flip a
decision: a seeded request's tokens are the same alone and inside BlockServe's mixed batches (rows on
different canvases and steps, admitted at different cycles, preempted and resumed) and static batches,
packed or dense; and a request the runner forgets and sees again continues as if never preempted."""

from __future__ import annotations

import random
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import LAYOUTS, SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.static import StaticScheduler, sequential_scheduler
from tests.engine_utils import common_token, run_workload
from tests.factories import random_workload

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "diffusion_gemma_reference"
# sampler settings of the reference runs: fixed step counts, and adaptive stops at different steps
SAMPLERS = [
    {
        "entropy_bound": 0.5,
        "t_min": 0.4,
        "t_max": 0.8,
        "stability_threshold": 1,
        "confidence_threshold": 0.005,
    },
    {
        "entropy_bound": 1000.0,
        "t_min": 0.05,
        "t_max": 0.1,
        "stability_threshold": 1,
        "confidence_threshold": 1.0,
    },
    {"entropy_bound": 3.0, "t_min": 0.4, "t_max": 0.8, "stability_threshold": 0, "confidence_threshold": 1.5},
]


@pytest.fixture(scope="module")
def float64_model():
    return load_model(str(REFERENCE), dtype="float64")


def _with(loaded, canvas: int, sampler: dict):
    config = replace(loaded.config.with_sampler(**sampler), canvas_length=canvas)
    return replace(loaded, config=config)


workloads = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "requests": st.integers(2, 7),
        "canvas": st.sampled_from([4, 8, 16]),
        "steps": st.integers(2, 10),
        "sampler": st.integers(0, len(SAMPLERS) - 1),
        "budget_slack": st.integers(0, 60),
        "admission": st.sampled_from(["preempt", "projected"]),
        "static_batch": st.integers(1, 5),
        "eos_rank": st.integers(0, 6),
        "layout": st.sampled_from(LAYOUTS),
    }
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=workloads)
def test_a_requests_tokens_are_independent_of_the_batch(float64_model, case):
    rng = random.Random(case["seed"])
    canvas = case["canvas"]
    loaded = _with(float64_model, canvas, SAMPLERS[case["sampler"]])
    workload = random_workload(rng, case["requests"], 256, canvas, max_prompt=20, max_blocks=3)
    sampling = {request_id: RequestParams(seed=rng.randrange(1000)) for request_id, _, _ in workload}
    decoding = DecodingConfig(block_length=canvas, steps_per_block=case["steps"])

    def run(scheduler, order=None):
        return run_workload(loaded, scheduler, decoding, workload, order, sampling)

    free = run(partial(sequential_scheduler, canvas, [], ignore_eos=True))
    eos = [common_token(free, case["eos_rank"])]
    alone = run(partial(sequential_scheduler, canvas, eos))
    peak = max(len(p) + g + canvas for _, p, g in workload)
    scheduling = SchedulerConfig(
        token_budget=peak + case["budget_slack"], admission=case["admission"], layout=case["layout"]
    )
    order = rng.sample(range(len(workload)), len(workload))
    static = partial(StaticScheduler, canvas, eos, batch_size=case["static_batch"], layout=case["layout"])
    assert run(partial(BlockServeScheduler, canvas, eos, scheduling), order) == alone
    assert run(static, order) == alone
