"""Block diffusion: LLaDA2.0 (mixture of experts) and SDAR (dense, Qwen3) reproduce their reference
logits and decoding runs token for token; the exact KV cache gives what recomputing the whole context
gives; batching never changes a request's tokens."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from functools import partial

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from dllm_contracts.scheduler_config import LAYOUTS, SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.engine import Engine
from engine_pod.families.registry import family_of
from engine_pod.generation import generate_one
from engine_pod.loading.config_readers import config_from_dict
from engine_pod.loading.loader import load_model
from engine_pod.models.config import ModelConfigError
from engine_pod.runner.contract import scheduling_facts
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.static import StaticScheduler, sequential_scheduler
from tests.engine_utils import block_causal_logits, common_token, dllm_generate_json, run_workload, tokens
from tests.factories import BLOCK_REFERENCE_DIR, random_workload, sdar_config, write_checkpoint

VECTORS = BLOCK_REFERENCE_DIR
REFERENCE = VECTORS / "llada2"
FAMILIES = ["llada2", "sdar"]
LOGIT_ATOL = 1e-3
NEAR_TIE = 1e-4  # top-2 logit gap below which float32 rounding may pick either token


@dataclass(frozen=True)
class ReferenceRun:
    """One reference decoding run, whatever the family's generate calls its arguments."""

    prompt_ids: list[int]
    gen_length: int
    block_length: int
    steps: int
    threshold: float
    eos_id: int
    output_ids: list[int]  # the reference's result: LLaDA2 cut after the first EOS; SDAR whole blocks
    forwards: int  # forwards that denoise (SDAR's forwards that only store a block's K/V left out)


def _reference_runs(family: str) -> list[ReferenceRun]:
    runs = json.loads((VECTORS / family / "generate.json").read_text())["runs"]
    if family == "llada2":
        return [
            ReferenceRun(
                r["prompt_ids"],
                a["gen_length"],
                a["block_length"],
                a["steps"],
                a["threshold"],
                a["eos_id"],
                r["output_ids"],
                r["nfe"],
            )
            for r, a in ((r, r["args"]) for r in runs)
        ]
    return [
        ReferenceRun(
            r["prompt_ids"],
            a["gen_length"],
            a["block_length"],
            a["denoising_steps"],
            a["confidence_threshold"],
            a["stopping_criteria_idx"][0],
            r["output_ids"],
            r["denoise_forwards"],
        )
        for r, a in ((r, r["args"]) for r in runs)
    ]


def _runs() -> list[dict]:
    return json.loads((REFERENCE / "generate.json").read_text())["runs"]


@pytest.fixture(scope="module")
def models():
    return {family: load_model(str(VECTORS / family)) for family in FAMILIES}


@pytest.fixture(scope="module")
def loaded(models):
    return models["llada2"]


@pytest.fixture(scope="module")
def float64_models():
    return {family: load_model(str(VECTORS / family), dtype="float64") for family in FAMILIES}


@pytest.fixture(scope="module")
def float64_model(float64_models):
    return float64_models["llada2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_block_causal_forward_logits(models, family):
    expected = load_file(str(VECTORS / family / "logits.safetensors"))
    for case in json.loads((VECTORS / family / "forward.json").read_text())["cases"]:
        logits = block_causal_logits(models[family].model, case["input_ids"], case["block_length"])
        reference = expected[case["logits_key"]]
        assert torch.allclose(logits, reference, atol=LOGIT_ATOL), case["name"]
        top2 = reference.topk(2, dim=-1).values
        decided = (top2[:, 0] - top2[:, 1]) > NEAR_TIE
        assert torch.equal(logits.argmax(-1)[decided], reference.argmax(-1)[decided]), case["name"]


@dataclass
class Generated:
    output_ids: list[int]  # as the reference returns them: cut after the first EOS
    finished_by_eos: bool
    forwards: int


def generate(loaded, prompt, gen_length, block_length, steps, threshold, cache="dual") -> Generated:
    """One request through the engine (sequential scheduler, block-diffusion runner)."""
    decoding = DecodingConfig(
        block_length=block_length,
        steps_per_block=steps,
        remasking="scheduled_threshold",
        threshold=threshold,
        cache=cache,
    )
    result = generate_one(loaded, prompt, gen_length, decoding)
    eos = set(loaded.config.eos_token_ids)
    cut = next((i + 1 for i, token in enumerate(result.token_ids) if token in eos), gen_length)
    return Generated(result.token_ids[:cut], result.finish_reason == "stop", result.num_forward_passes)


def _generate(loaded, run: dict, cache: str = "dual") -> Generated:
    args = run["args"]
    model = loaded if args["eos_id"] in loaded.config.eos_token_ids else _with_eos(loaded, args["eos_id"])
    return generate(
        model,
        run["prompt_ids"],
        args["gen_length"],
        args["block_length"],
        args["steps"],
        args["threshold"],
        cache,
    )


def _whole_blocks(loaded, run: ReferenceRun, cache: str, layout: str = "dense") -> tuple[list[int], int]:
    """Every token the engine commits after the prompt, whole blocks (what SDAR's generate returns), in
    the forwards' ``layout`` (a padded box, or packed rows)."""
    decoding = DecodingConfig(
        block_length=run.block_length,
        steps_per_block=run.steps,
        remasking="scheduled_threshold",
        threshold=run.threshold,
        cache=cache,
    )
    runner = make_runner(loaded, decoding, len(run.prompt_ids) + run.gen_length + 2 * run.block_length)
    scheduler = sequential_scheduler(
        run.block_length, [run.eos_id], layout=layout, **scheduling_facts(runner)
    )
    engine = Engine(runner, scheduler)
    request = scheduler.request_for("run", run.prompt_ids, tokens(run.gen_length))
    engine.add_request(request)
    engine.run()
    return request.generated, sum(record.forwards for record in engine.records)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cache", ["dual", "none"])
@pytest.mark.parametrize("index", range(len(_reference_runs("sdar"))))
def test_every_sdar_reference_run_is_reproduced(models, index, cache, layout):
    """SDAR's generate stores a completed block's K/V in a forward of its own; the engine stores it in the
    next block's first forward, so its forwards are the reference's denoising ones."""
    run = _reference_runs("sdar")[index]
    tokens, forwards = _whole_blocks(models["sdar"], run, cache, layout)
    assert tokens == run.output_ids
    assert forwards == run.forwards


def _with_eos(loaded, eos: int):
    return replace(loaded, config=loaded.config.with_eos((eos,)))


@pytest.mark.parametrize("index", range(len(_runs())))
def test_every_reference_run_is_reproduced_with_the_exact_cache(loaded, index):
    run = _runs()[index]
    result = _generate(loaded, run)
    assert result.output_ids == run["output_ids"]
    assert result.forwards == run["nfe"]


def test_the_eos_runs_stop_where_the_reference_stops(loaded):
    stopping = [run for run in _runs() if run["args"]["eos_id"] != 501]
    assert stopping and all(len(run["output_ids"]) < run["args"]["gen_length"] for run in stopping)
    for run in stopping:
        result = _generate(loaded, run)
        assert result.finished_by_eos and result.output_ids == run["output_ids"]


def test_dllm_generate_reproduces_a_reference_run():
    """The product path: `dllm generate` on the checkpoint directory, the reference's steps per block
    given as steps over all blocks."""
    run = next(r for r in _runs() if len(r["prompt_ids"]) % r["args"]["block_length"])
    args = run["args"]
    steps = args["steps"] * args["gen_length"] // args["block_length"]
    payload = dllm_generate_json(
        REFERENCE,
        run["prompt_ids"],
        *("--gen-length", str(args["gen_length"]), "--block-length", str(args["block_length"])),
        *("--steps", str(steps), "--threshold", str(args["threshold"])),
    )
    assert payload["token_ids"][: len(run["output_ids"])] == run["output_ids"]
    assert payload["num_forward_passes"] == run["nfe"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_exact_cache_gives_the_tokens_of_recomputing_the_whole_context(float64_models, family):
    """float64, where a flip would need a near-tie: random prompts, block lengths, steps and thresholds."""
    model = float64_models[family]
    rng = random.Random(11)
    for _ in range(12):
        prompt = [rng.randrange(480) for _ in range(rng.randint(1, 20))]
        block_length = rng.choice([2, 4, 8])
        steps = rng.randint(1, block_length)
        gen_length = block_length * rng.randint(1, 4)
        threshold = rng.choice([0.2, 0.5, 0.9, 1.0])
        cached = generate(model, prompt, gen_length, block_length, steps, threshold, cache="dual")
        full = generate(model, prompt, gen_length, block_length, steps, threshold, cache="none")
        assert cached.output_ids == full.output_ids, (prompt, block_length, steps, threshold)
        assert cached.forwards == full.forwards


def test_a_config_the_reference_code_does_not_implement_is_refused():
    raw = json.loads((REFERENCE / "config.json").read_text())
    with pytest.raises(ModelConfigError, match="score_function"):
        config_from_dict({**raw, "score_function": "softmax"})
    with pytest.raises(ModelConfigError, match="groups"):
        config_from_dict({**raw, "n_group": 3})
    config = config_from_dict(raw)
    assert (
        family_of(config).kind.name == "block_causal"
        and config.moe.num_experts == 8
        and config.rotary_dim == 8
    )


block_workloads = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "requests": st.integers(2, 8),
        "block": st.sampled_from([4, 8]),
        "threshold": st.sampled_from([0.3, 0.6, 1.0]),
        "cache": st.sampled_from(["none", "dual"]),
        "budget_slack": st.integers(0, 120),
        "admission": st.sampled_from(["preempt", "projected"]),
        "static_batch": st.integers(1, 5),
        "eos_rank": st.integers(0, 6),
        "layout": st.sampled_from(LAYOUTS),
    }
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=block_workloads)
def test_a_block_diffusion_requests_output_is_independent_of_the_batch(float64_model, case):
    """float64: BlockServe's mixed batches (rows on different blocks, admitted, preempted and resumed with
    their cache rebuilt) and static batches give every request the tokens it gets alone."""
    rng = random.Random(case["seed"])
    block = case["block"]
    workload = random_workload(rng, case["requests"], 480, block, max_prompt=20, max_blocks=3)
    decoding = DecodingConfig(
        block_length=block,
        steps_per_block=block // 2,
        remasking="scheduled_threshold",
        threshold=case["threshold"],
        cache=case["cache"],
    )
    free = run_workload(
        float64_model, partial(sequential_scheduler, block, [], ignore_eos=True), decoding, workload
    )
    eos = [common_token(free, case["eos_rank"])]
    alone = run_workload(float64_model, partial(sequential_scheduler, block, eos), decoding, workload)
    peak = max(len(p) + g + block for _, p, g in workload)
    scheduling = SchedulerConfig(
        token_budget=peak + case["budget_slack"], admission=case["admission"], layout=case["layout"]
    )
    order = list(range(len(workload)))
    rng.shuffle(order)
    blockserve = partial(BlockServeScheduler, block, eos, scheduling)
    static = partial(StaticScheduler, block, eos, batch_size=case["static_batch"], layout=case["layout"])
    assert run_workload(float64_model, blockserve, decoding, workload, order) == alone
    assert run_workload(float64_model, static, decoding, workload, order) == alone


def test_a_checkpoint_with_tied_embeddings_loads_its_head_from_the_embedding(tmp_path):
    """SDAR-1.7B and -4B tie the LM head to the input embedding: no lm_head.weight in the checkpoint."""
    directory = write_checkpoint(tmp_path / "tied", sdar_config(tie=True))
    assert "lm_head.weight" not in load_file(str(directory / "model.safetensors"))
    model = load_model(str(directory)).model
    assert model.lm_head.weight.data_ptr() == model.word_embeddings.weight.data_ptr()
    embedding = load_file(str(directory / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(model.lm_head.weight, embedding)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_cycles_padding_is_counted_as_computed_not_useful(loaded, layout):
    """Rows of different prompt lengths and a finished row: a padded box computes positions that no row
    uses, packed rows compute only the rows' own; a finished row (static batching) is never useful."""
    decoding = DecodingConfig(
        block_length=4,
        steps_per_block=2,
        remasking="scheduled_threshold",
        threshold=1.0,
        prefix_cache=False,  # the finished row's prompt is the long one's first blocks
    )
    rows = [
        CycleRow(tuple(range(3, 5)), owner="short"),
        CycleRow(tuple(range(3, 21)), owner="long"),
        CycleRow(tuple(range(3, 11)), active=False, owner="finished"),
    ]
    cycle = SchedulerOutput.of_rows(rows, gather_rows=False, packed=layout == "packed")
    stats = make_runner(loaded, decoding, 256).run(cycle).stats
    first_widths = {"short": 4, "long": 20, "finished": 12}  # the prompt up to its block's end, then a block
    useful_first = first_widths["short"] + first_widths["long"]
    useful = useful_first + (stats.forwards - 1) * 2 * 4
    assert stats.useful_positions == useful
    if layout == "packed":
        assert stats.computed_positions == useful + first_widths["finished"] + (stats.forwards - 1) * 4
    else:
        assert stats.computed_positions == 3 * 20 + (stats.forwards - 1) * 3 * 4


@pytest.mark.parametrize("option", ["record_trace", "record_margins"])
def test_a_runner_option_the_family_does_not_record_is_refused_by_name(loaded, option):
    decoding = DecodingConfig(block_length=4, steps_per_block=2, remasking="scheduled_threshold")
    with pytest.raises(ValueError, match=option):
        make_runner(loaded, decoding, 256, **{option: True})
    runner = make_runner(loaded, decoding, 256, **{option: False})
    assert runner.grid_aligned


def test_the_paged_runner_frees_a_request_when_the_scheduler_names_it_released(loaded):
    """A finished request's pages go back at the next cycle, where the scheduler's output names it; a
    cancelled one's likewise; a request still in the rows keeps its pages all along."""
    decoding = DecodingConfig(
        block_length=4, steps_per_block=2, remasking="scheduled_threshold", prefix_cache=False
    )
    runner = make_runner(loaded, decoding, 256)
    scheduler = BlockServeScheduler(4, [], SchedulerConfig(token_budget=256), **scheduling_facts(runner))
    engine = Engine(runner, scheduler)
    for request_id, budget in (("short", 4), ("long", 12)):
        engine.add_request(scheduler.request_for(request_id, [3, 4, 5, 6], tokens(budget)))
    finished = engine.step().finished
    assert [r.request_id for r in finished] == ["short"] and set(runner.stepper.states) == {"short", "long"}
    held = runner.stepper.pool.table("long")
    assert engine.step().output.released == ["short"]
    assert set(runner.stepper.states) == {"long"} and not runner.stepper.pool.table("short")
    assert runner.stepper.pool.table("long")[: len(held)] == held
    scheduler.cancel("long")
    engine.add_request(scheduler.request_for("next", [7, 8], tokens(4)))
    assert engine.step().output.released == ["long"]
    assert set(runner.stepper.states) == {"next"} and not runner.stepper.pool.table("long")


@pytest.mark.parametrize("spec", ["random:llada2-tiny", "random:sdar-tiny"])
def test_a_threshold_is_calibrated_on_a_block_diffusion_models_first_step(spec):
    """What ``dllm bench --calibrate-threshold`` runs: the first forward's confidences over a few prompts."""
    from engine_pod.bench.calibrate import calibrate_threshold

    loaded = load_model(spec)
    calibrated = calibrate_threshold(
        loaded, DecodingConfig(block_length=8, steps_per_block=8), [[5] * 9, [7] * 3], 0.5
    )
    assert calibrated["sampled_positions"] == 12 and 0 < calibrated["threshold"] <= 1
