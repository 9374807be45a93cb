"""DiffusionGemma through the engine (kinds/canvas/stepper.py): the reference's 40 seeded generate runs
(tests/data/diffusion_gemma_reference) token for token in float32, alone through the sequential
scheduler, inside BlockServe's mixed batches (packed and dense, rows joining at different cycles) and
static batches, and through `dllm generate`; the options the family cannot honour are refused by name."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import LAYOUTS, SchedulerConfig
from dllm_contracts.text import completion_tokens
from engine_pod.decoding.config import DecodingConfig, DecodingConfigError
from engine_pod.engine import Engine
from engine_pod.families.diffusion_gemma.sampler_settings import EntropyBoundParams
from engine_pod.families.registry import family_of
from engine_pod.loading.loader import load_model
from engine_pod.runner.contract import scheduling_facts
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.static import StaticScheduler, sequential_scheduler
from tests.engine_utils import dllm_generate_json

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "diffusion_gemma_reference"
RUNS = json.loads((REFERENCE / "generate.json").read_text())["runs"]
SAMPLER = ("entropy_bound", "t_min", "t_max", "stability_threshold", "confidence_threshold")
SETTINGS = (*SAMPLER, "canvas_length", "max_denoising_steps", "eos_token_id")


def _settings(run: dict) -> tuple:
    return tuple(run["args"][name] for name in SETTINGS)


# runs that can share a batch: the engine's sampler settings, canvas and EOS are one per runner
GROUPS = [
    [i for i, run in enumerate(RUNS) if _settings(run) == key]
    for key in dict.fromkeys(_settings(run) for run in RUNS)
]


@pytest.fixture(scope="module")
def base():
    return load_model(str(REFERENCE))


def _loaded(base, run: dict):
    """The checkpoint with the run's sampler settings, canvas and EOS (as its generate call sets them)."""
    args = run["args"]
    config = base.config.with_sampler(**{name: args[name] for name in SAMPLER})
    config = replace(config, canvas_length=args["canvas_length"]).with_eos((args["eos_token_id"],))
    return replace(base, config=config)


def _decoding(run: dict) -> DecodingConfig:
    args = run["args"]
    return DecodingConfig(block_length=args["canvas_length"], steps_per_block=args["max_denoising_steps"])


def _expected(run: dict, generated: list[int]) -> tuple[list[int], list[int]]:
    """The reference's output and ``generated`` (whole canvases), each up to the first EOS (the reference
    pads after it)."""
    args = run["args"]
    kept = completion_tokens(generated, [args["eos_token_id"]])
    assert set(run["output_ids"][kept:]) <= {args["pad_token_id"]} or kept == len(generated)
    return run["output_ids"][:kept], generated[:kept]


def _run(base, indices: list[int], scheduler_of, order: list[int] | None = None) -> tuple[dict, Engine]:
    """Every run of ``indices`` submitted together (in ``order``): the generated tokens per run."""
    first = RUNS[indices[0]]
    loaded, decoding = _loaded(base, first), _decoding(first)
    budget = sum(len(RUNS[i]["prompt_ids"]) + RUNS[i]["args"]["max_new_tokens"] + 32 for i in indices)
    runner = make_runner(loaded, decoding, pool_tokens=budget)
    scheduler = scheduler_of(first["args"], **scheduling_facts(runner))
    engine = Engine(runner, scheduler)
    requests = {}
    for i in order or indices:
        run = RUNS[i]
        params = RequestParams(max_tokens=run["args"]["max_new_tokens"], seed=run["seed"])
        request = requests[i] = scheduler.request_for(str(i), run["prompt_ids"], params)
        engine.add_request(request)
    engine.run()
    return {i: request.generated for i, request in requests.items()}, engine


def _sequential(args, **facts):
    return sequential_scheduler(args["canvas_length"], [args["eos_token_id"]], **facts)


@pytest.mark.parametrize("index", range(len(RUNS)))
def test_a_single_request_reproduces_its_reference_run(base, index):
    """Token for token, and one forward per reference denoising step in each canvas."""
    run = RUNS[index]
    generated, engine = _run(base, [index], _sequential)
    _assert_reproduced([index], generated)
    assert [record.forwards for record in engine.records] == run["steps_per_canvas"]


def _blockserve(budget: int, layout: str = "packed"):
    def build(args, **facts):
        config = SchedulerConfig(token_budget=budget, layout=layout)
        return BlockServeScheduler(args["canvas_length"], [args["eos_token_id"]], config, **facts)

    return build


def _widest(indices: list[int]) -> int:
    return max(len(RUNS[i]["prompt_ids"]) + 3 * RUNS[i]["args"]["canvas_length"] for i in indices)


def _assert_reproduced(indices: list[int], generated: dict) -> None:
    for i in indices:
        expected, tokens = _expected(RUNS[i], generated[i])
        assert tokens == expected, i


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("group", range(len(GROUPS)))
def test_blockserve_mixed_batches_reproduce_the_reference_runs(base, group, layout):
    """A group's runs submitted together in shuffled order under a budget that fits the widest run and
    little more: rows join at different cycles, on different canvases, and stop at different steps."""
    indices = GROUPS[group]
    order = random.Random(group).sample(indices, len(indices))
    generated, engine = _run(base, indices, _blockserve(_widest(indices) + 24, layout), order)
    _assert_reproduced(indices, generated)
    if len(indices) > 2:
        admitted_at = [cycle for cycle, record in enumerate(engine.records) if record.admitted]
        assert len(admitted_at) > 1 and max(record.rows for record in engine.records) > 1


def test_a_preempted_request_resumes_with_its_reference_tokens(base):
    """Preempted at a canvas boundary, a request keeps only its generator's state; back in the batch it
    re-encodes its context in the chunks that first wrote it and goes on with the reference's tokens."""
    indices = GROUPS[0]
    order = random.Random(0).sample(indices, len(indices))
    generated, engine = _run(base, indices, _blockserve(_widest(indices)), order)
    assert sum(record.preempted for record in engine.records) >= 2
    assert not engine.runner.stepper.suspended  # every preempted request came back and took its state
    _assert_reproduced(indices, generated)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_static_batches_reproduce_the_reference_runs(base, layout):
    """Fast-dLLM's batching: rows that stopped are forwarded until the slowest is done, and finished
    requests stay in the batch, never committed; no row's tokens change."""
    for group, indices in enumerate(GROUPS):
        order = random.Random(group).sample(indices, len(indices))

        def static(args, **facts):
            eos = [args["eos_token_id"]]
            return StaticScheduler(args["canvas_length"], eos, batch_size=3, layout=layout, **facts)

        generated, _ = _run(base, indices, static, order)
        _assert_reproduced(indices, generated)


# runs of one canvas and EOS whatever their sampler settings: one batch, each row with its own settings
MIXED = [
    [i for i, run in enumerate(RUNS) if (run["args"]["canvas_length"], run["args"]["eos_token_id"]) == key]
    for key in ((16, 1), (32, 1))
]


@pytest.mark.parametrize("indices", MIXED, ids=["canvas16", "canvas32"])
def test_rows_with_different_sampler_settings_share_batches_and_keep_their_reference_tokens(base, indices):
    """Each request carries its run's settings (``RequestParams.family``, as the gateway queues the API's
    fields) and those equal to the runner's (the checkpoint's, its steps the decoding's) none; BlockServe
    mixes them in its batches under a budget of a few rows, so rows join at different cycles."""
    args = RUNS[indices[0]]["args"]
    loaded = replace(base, config=replace(base.config, canvas_length=args["canvas_length"]))
    decoding = DecodingConfig(block_length=args["canvas_length"], steps_per_block=48)
    runner = make_runner(loaded, decoding, pool_tokens=4 * _widest(indices))
    scheduler = _blockserve(4 * _widest(indices))(args, **scheduling_facts(runner))
    engine, requests = Engine(runner, scheduler), {}
    for i in random.Random(len(indices)).sample(indices, len(indices)):
        run = RUNS[i]
        own = {name: run["args"][name] for name in (*SAMPLER, "max_denoising_steps")}
        family = {} if EntropyBoundParams(**own) == runner.request_defaults else own
        params = RequestParams(max_tokens=run["args"]["max_new_tokens"], seed=run["seed"], family=family)
        request = requests[i] = scheduler.request_for(str(i), run["prompt_ids"], params)
        engine.add_request(request)
    engine.run()
    assert any(not r.params.family for r in requests.values()) or args["canvas_length"] == 32
    assert max(record.rows for record in engine.records) > 2
    _assert_reproduced(indices, {i: request.generated for i, request in requests.items()})


def test_dllm_generate_reproduces_a_reference_run():
    """The product path on the checkpoint directory: a run with adaptive stops in three canvases, its
    sampler settings as flags."""
    run = next(r for r in RUNS if r["args"]["entropy_bound"] == 1000.0 and r["args"]["canvas_length"] == 16)
    args = run["args"]
    payload = dllm_generate_json(
        REFERENCE,
        run["prompt_ids"],
        *("--gen-length", str(args["max_new_tokens"]), "--block-length", str(args["canvas_length"])),
        *("--steps-per-block", str(args["max_denoising_steps"]), "--seed", str(run["seed"])),
        *(f"--{name.replace('_', '-')}={args[name]}" for name in SAMPLER),
    )
    assert payload["token_ids"] == run["output_ids"][: args["max_new_tokens"]]
    assert payload["num_forward_passes"] == sum(run["steps_per_canvas"])


def test_the_loaded_config_gives_what_the_engine_needs(base):
    config = base.config
    assert config.family == "diffusion_gemma" and family_of(config).kind.name == "canvas"
    assert config.eos_token_ids == (1,) and config.vocab_size == 256 and config.canvas_length == 16


def test_options_the_family_cannot_honour_are_refused_by_name(base):
    with pytest.raises(DecodingConfigError, match="canvas_length 16"):
        make_runner(base, DecodingConfig(block_length=32), 256)
    with pytest.raises(DecodingConfigError, match="canvas 'full'"):
        make_runner(base, DecodingConfig(block_length=16, masked_suffix=True), 256)
    for option in ("record_trace", "record_margins"):
        with pytest.raises(ValueError, match=option):
            make_runner(base, DecodingConfig(block_length=16), 256, **{option: True})
    runner = make_runner(base, DecodingConfig(block_length=16), 256)
    assert not runner.grid_aligned and not runner.shares_blocks
    with pytest.raises(ValueError, match="calibration"):
        runner.first_block_confidences([[3, 4]])


def test_a_cycle_beyond_the_token_budget_is_refused(base):
    runner = make_runner(base, DecodingConfig(block_length=16, steps_per_block=2), pool_tokens=40)
    rows = [CycleRow(tuple(range(3, 13)), owner="a"), CycleRow(tuple(range(3, 13)), owner="b")]
    with pytest.raises(ValueError, match="more than the pool's 40"):
        runner.run(SchedulerOutput.of_rows(rows))
    assert len(runner.run(SchedulerOutput.of_rows(rows[:1])).blocks[0]) == 16


def test_released_requests_are_forgotten_and_preempted_ones_keep_their_generator_only(base):
    runner = make_runner(base, DecodingConfig(block_length=16, steps_per_block=2), pool_tokens=256)
    a, b = CycleRow((3, 4, 5), owner="a"), CycleRow((6, 7), owner="b")
    first = runner.run(SchedulerOutput.of_rows([a, b]))
    assert set(runner.stepper.states) == {"a", "b"} and runner.stepper.states["a"].chunks == [3]
    grown = CycleRow(a.prefix_ids + tuple(first.blocks[0]), owner="a")
    second = SchedulerOutput.of_rows([grown])
    second.released = ["b"]
    runner.run(second)
    assert set(runner.stepper.states) == {"a"} and runner.stepper.states["a"].chunks == [3, 16]
    third = SchedulerOutput.of_rows([CycleRow((8,), owner="c")])
    third.released, third.preempted = ["a"], ["a"]
    runner.run(third)
    assert set(runner.stepper.states) == {"c"} and runner.stepper.suspended["a"][1] == [3, 16]


@pytest.mark.parametrize("policy", ["blockserve", "dllm-serve"])
def test_the_serving_scheduler_is_made_for_diffusion_gemma(base, policy):
    """What ``dllm serve``'s worker builds for a DiffusionGemma model (its config names no K/V heads; the
    kept share of a dense cache is 1)."""
    from engine_pod.engine import scheduler_for

    run = RUNS[0]
    runner = make_runner(_loaded(base, run), _decoding(run), pool_tokens=512)
    scheduler = scheduler_for(runner, policy, SchedulerConfig(token_budget=512))
    assert scheduler.block_length == run["args"]["canvas_length"]
