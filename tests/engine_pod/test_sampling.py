"""Seeded sampling: a request's output depends on its prompt, its settings and its seed only, never on
the batch it runs in or its row (float64 reference models, every scheduler)."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_contracts.request_params import RequestParams
from dllm_contracts.request_setting import SettingError
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.bench.census_run import Scenario, decoding_for, run_scenario
from engine_pod.decoding.config import DecodingConfig
from engine_pod.decoding.sampling import sample, uniform_noise
from engine_pod.engine import Engine
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.request import Request
from engine_pod.scheduler.static import StaticScheduler, sequential_scheduler
from tests.engine_utils import built_for, tokens
from tests.factories import BLOCK_REFERENCE_DIR, REFERENCE_DIR, random_workload

BLOCK = 8


@pytest.fixture(scope="module")
def models():
    return {family: load_model(str(REFERENCE_DIR / family), dtype="float64") for family in ("llada", "dream")}


def _run(loaded, scheduler, decoding, workload, sampling: dict, order=None) -> dict[str, list[int]]:
    engine = Engine(make_runner(loaded, decoding), scheduler)
    for request_id, prompt, budget in workload if order is None else [workload[i] for i in order]:
        engine.add_request(
            Request.from_tokens(request_id, prompt, tokens(budget, sampling.get(request_id)), BLOCK)
        )
    outputs: dict[str, list[int]] = {}
    engine.run(lambda r: outputs.__setitem__(r.request_id, list(r.generated)))
    return outputs


cases = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "family": st.sampled_from(["llada", "dream"]),
        "requests": st.integers(2, 8),
        "cache": st.sampled_from(["none", "prefix", "dual"]),
        "threshold": st.sampled_from([0.3, 0.9]),
        "temperature": st.sampled_from([0.5, 1.0, 1.5]),
        "top_p": st.sampled_from([1.0, 0.9]),
        "top_k": st.sampled_from([0, 5]),
        "static_batch": st.integers(1, 5),
    }
)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=cases)
def test_a_seeded_request_samples_the_same_alone_and_in_any_batch(models, case):
    rng = random.Random(case["seed"])
    workload = random_workload(rng, case["requests"], 480, BLOCK, max_prompt=30, max_blocks=3)
    decoding = DecodingConfig(
        block_length=BLOCK, steps_per_block=4, threshold=case["threshold"], cache=case["cache"]
    )
    shape = {k: case[k] for k in ("temperature", "top_p", "top_k")}
    sampling = {  # some requests greedy, the others sampled, each with its own seed
        request_id: RequestParams(seed=rng.randrange(2**40), **shape) if rng.random() < 0.7 else None
        for request_id, _, _ in workload
    }
    loaded = models[case["family"]]
    alone = _run(loaded, sequential_scheduler(BLOCK, [], ignore_eos=True), decoding, workload, sampling)
    order = list(range(len(workload)))
    rng.shuffle(order)
    blockserve = BlockServeScheduler(BLOCK, [], SchedulerConfig(token_budget=4096), ignore_eos=True)
    assert _run(loaded, blockserve, decoding, workload, sampling, order) == alone
    static = StaticScheduler(BLOCK, [], batch_size=case["static_batch"], ignore_eos=True)
    assert _run(loaded, static, decoding, workload, sampling, order) == alone


def test_the_seed_decides_and_temperature_zero_is_greedy(models):
    loaded = models["llada"]
    workload = random_workload(random.Random(3), 4, 480, BLOCK, max_prompt=20, max_blocks=3)
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=4)

    def run(sampling):
        scheduler = BlockServeScheduler(BLOCK, [], SchedulerConfig(token_budget=4096), ignore_eos=True)
        return _run(loaded, scheduler, decoding, workload, {i: sampling for i, _, _ in workload})

    greedy = run(None)
    assert run(RequestParams(temperature=0.0, seed=5)) == greedy  # no draw at all
    first, again, other = (
        run(RequestParams(temperature=1.0, seed=1)),
        run(RequestParams(temperature=1.0, seed=1)),
        run(RequestParams(temperature=1.0, seed=2)),
    )
    assert first == again
    assert first != other and first != greedy  # the check has teeth: the seed and sampling change tokens


def test_draws_follow_the_filtered_distribution():
    """Gumbel-max over hashed noise samples softmax(logits / T) restricted to top-k and top-p."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)).repeat(20_000, 1)
    keys = torch.arange(20_000, dtype=torch.int64) * 7919 + 11
    ones = torch.ones(20_000, dtype=torch.float64)

    def counts(top_k: int, top_p: float) -> torch.Tensor:
        drawn, _ = sample(
            logits, ones, torch.full((20_000,), top_k), torch.full((20_000,), top_p).double(), keys
        )
        return torch.bincount(drawn, minlength=4).double() / 20_000

    assert torch.allclose(
        counts(0, 1.0), torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64), atol=0.015
    )
    assert torch.allclose(counts(2, 1.0), torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64), atol=0.015)
    assert counts(0, 0.7)[2:].sum() == 0  # the nucleus of 0.7 holds the first two tokens only
    noise = uniform_noise(keys[:4], 1000, torch.float64)
    assert bool(((noise > 0) & (noise < 1)).all()) and abs(float(noise.mean()) - 0.5) < 0.02


def test_a_sampled_row_never_draws_the_mask_token_even_where_the_model_ranks_it_first():
    """Committing the mask token would leave its position masked: a block-diffusion cycle then ended with
    masks (random weights rank the mask token high; SDAR's exact-cache runner raised)."""
    logits = torch.tensor([[5.0, 1.0, 0.5, 0.2]], dtype=torch.float64).repeat(2_000, 1)  # token 0: the mask
    keys = torch.arange(2_000, dtype=torch.int64) * 7919 + 11
    ones = torch.ones(2_000, dtype=torch.float64)
    everything = (torch.zeros(2_000, dtype=torch.int64), ones)
    assert int((sample(logits, ones, *everything, keys)[0] == 0).sum()) > 1_000  # the check has teeth
    drawn, probability = sample(logits, ones, *everything, keys, never=0)
    assert int((drawn == 0).sum()) == 0 and bool((probability > 0).all())
    loaded = load_model("random:sdar-tiny")  # the cycles that ended with masks, run again
    scenario = Scenario("random:sdar-tiny", "static", 16, 1, cycles=3, requests="sampled")
    assert run_scenario(loaded, scenario, decoding_for(loaded)).forwards > 0


@pytest.mark.parametrize("values", [{"temperature": -1}, {"top_p": 0}, {"top_k": -2}, {"seed": -1}])
def test_sampling_settings_out_of_range_are_refused(values):
    with pytest.raises(SettingError):
        RequestParams(**values)


def _run_with_logprobs(loaded, scheduler, decoding, workload, asked: dict, sampling: dict) -> dict:
    runner = make_runner(loaded, decoding, 4096)
    scheduler = built_for(scheduler, runner)
    engine = Engine(runner, scheduler)
    for request_id, prompt, budget in workload:
        params = tokens(budget, sampling.get(request_id), logprobs=asked.get(request_id))
        engine.add_request(scheduler.request_for(request_id, prompt, params))
    kept: dict[str, list] = {}
    while engine.has_work():
        result = engine.step()
        for request_id, row, values in zip(
            result.output.request_ids, result.output.rows, result.logprobs or []
        ):
            if row.active and values is not None:
                kept.setdefault(request_id, []).extend(values)
    return kept


@pytest.fixture(scope="module")
def block_model():
    return load_model(str(BLOCK_REFERENCE_DIR / "llada2"), dtype="float64")


@pytest.mark.parametrize("family", ["dream", "llada2"])
def test_logprobs_are_those_of_the_committing_step_and_do_not_depend_on_the_batch(
    models, block_model, family
):
    """Dream (bidirectional, dual cache) and LLaDA2.0 (block diffusion, exact cache) alike."""
    loaded = block_model if family == "llada2" else models[family]
    workload = random_workload(random.Random(5), 5, 480, BLOCK, max_prompt=20, max_blocks=3)
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=4, threshold=0.5)
    ids = [request_id for request_id, _, _ in workload]
    asked = {ids[0]: 3, ids[1]: 0, ids[2]: 3}
    sampling = {ids[2]: RequestParams(temperature=1.0, top_k=5, seed=3)}
    alone = {
        request_id: _run_with_logprobs(
            loaded,
            partial(sequential_scheduler, BLOCK, [], ignore_eos=True),
            decoding,
            [item],
            asked,
            sampling,
        ).get(request_id)
        for item in workload
        for request_id in [item[0]]
    }
    batched = _run_with_logprobs(
        loaded,
        partial(BlockServeScheduler, BLOCK, [], SchedulerConfig(4096), ignore_eos=True),
        decoding,
        workload,
        asked,
        sampling,
    )
    assert set(batched) == set(asked)
    budgets = {request_id: budget for request_id, _, budget in workload}
    assert all(len(batched[request_id]) >= budgets[request_id] for request_id in asked)  # every token
    for request_id in asked:  # the same tokens and alternatives; values equal up to float64 rounding
        assert len(alone[request_id]) == len(batched[request_id])
        for (lp_alone, alt_alone), (lp, alt) in zip(alone[request_id], batched[request_id]):
            assert lp == pytest.approx(lp_alone, abs=1e-9)
            assert [i for i, _ in alt] == [i for i, _ in alt_alone]
            assert [v for _, v in alt] == pytest.approx([v for _, v in alt_alone], abs=1e-9)
    for logprob, alternatives in batched[ids[0]]:  # greedy: the committed token is the likeliest
        assert logprob <= 0 and len(alternatives) == 3 and alternatives[0][1] == logprob
        assert [v for _, v in alternatives] == sorted((v for _, v in alternatives), reverse=True)
    assert all(alternatives == [] for _, alternatives in batched[ids[1]])
    drawn = batched[ids[2]]  # sampled within the top 5: every alternative beyond them is impossible
    assert all(len(alternatives) == 3 and logprob <= 0 for logprob, alternatives in drawn)
