"""The logit budget: the LM head's chunk of positions changes no output (greedy, seeded sampling, log
probabilities; float64 and float32), and an out-of-range budget is refused in one line."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.cli.main import main
from engine_pod.decoding.config import DecodingConfig, DecodingConfigError
from engine_pod.engine import Engine
from engine_pod.kinds.canvas.context_cache import ContextCache, context_pool
from engine_pod.loading.loader import load_model
from engine_pod.models.logit_budget import LogitBudget
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from tests.engine_utils import built_for, tokens
from tests.factories import REFERENCE_DIR, random_workload

BLOCK = 8
UNBOUNDED = 1 << 30


def run(loaded, positions: int | None, candidates: int = 0) -> dict:
    """Every request's tokens and log probabilities (3 alternatives) under this logit budget: one greedy,
    one seeded sampled (top-k 5), one sampled with top-p, all in one BlockServe batch."""
    decoding = DecodingConfig(
        block_length=BLOCK, steps_per_block=4, threshold=0.5, max_materialized_logits=positions
    )
    if candidates:
        decoding = DecodingConfig(**{**decoding.__dict__, "logit_candidates": candidates})
    workload = random_workload(random.Random(7), 6, 480, BLOCK, max_prompt=20, max_blocks=3)
    ids = [request_id for request_id, _, _ in workload]
    sampling = {
        ids[1]: RequestParams(temperature=1.0, top_k=5, seed=3),
        ids[2]: RequestParams(temperature=0.7, top_p=0.9, seed=4),
    }
    runner = make_runner(loaded, decoding, 4096)
    scheduler = built_for(
        partial(BlockServeScheduler, BLOCK, [], SchedulerConfig(4096), ignore_eos=True), runner
    )
    engine = Engine(runner, scheduler)
    for request_id, prompt, budget in workload:
        engine.add_request(
            scheduler.request_for(request_id, prompt, tokens(budget, sampling.get(request_id), logprobs=3))
        )
    kept: dict[str, list] = {}
    outputs: dict[str, list[int]] = {}
    while engine.has_work():
        result = engine.step()
        outputs.update({request.request_id: list(request.generated) for request in result.finished})
        for request_id, row, values in zip(
            result.output.request_ids, result.output.rows, result.logprobs or []
        ):
            if row.active and values is not None:
                kept.setdefault(request_id, []).extend(values)
    return {"logprobs": kept, "tokens": outputs}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_outputs_are_the_same_bits_whatever_the_chunk(dtype):
    loaded = load_model(str(REFERENCE_DIR / "llada"), dtype=dtype)
    unbounded = run(loaded, UNBOUNDED)
    assert len(unbounded["tokens"]) == 6 and len(unbounded["logprobs"]) == 6
    for positions in (1, 7, None):
        assert run(loaded, positions) == unbounded, positions  # every token and every float, exactly


@pytest.mark.parametrize("value", [0, -3])
def test_a_budget_below_one_position_is_refused(value):
    with pytest.raises(DecodingConfigError, match="max materialized logits must be at least 1"):
        DecodingConfig(max_materialized_logits=value)


@pytest.mark.parametrize(
    "command", [["bench"], ["eval"], ["worker", "--redis", "redis://127.0.0.1:1", "--service", "s"]]
)
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-materialized-logits", "0"], "--max-materialized-logits must be at least 1 position, got 0"),
        (["--logit-candidates", "-1"], "--logit-candidates must be at least 0, got -1"),
    ],
)
def test_the_commands_refuse_a_logit_budget_out_of_range_in_one_line(capsys, command, flags, message):
    assert main([*command, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_diffusion_gemmas_logits_are_the_same_bits_whatever_the_chunk(dtype):
    """DiffusionGemma's head (its sampler reads a canvas's logits whole) runs in the same chunks."""
    model = load_model("random:diffusion-gemma-tiny", dtype=dtype).model
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 1024, (1, 5 + 9 * r), generator=generator) for r in range(3)]
    canvas = torch.randint(0, 1024, (3, 32), generator=generator)
    pool = context_pool(model.config, 16, 32, getattr(torch, dtype), torch.device("cpu"))
    caches = [ContextCache(pool, str(row), model.config) for row in range(3)]
    for cache, prompt in zip(caches, prompts):
        model.encode(prompt, cache)

    def logits(positions: int | None) -> torch.Tensor:
        model.logit_budget = LogitBudget(positions)
        return model.denoise(canvas, caches)

    unbounded = logits(UNBOUNDED)
    for positions in (1, 7, None):
        assert torch.equal(logits(positions), unbounded), positions


@pytest.mark.parametrize("command", ["generate", "bench", "profile", "eval", "worker", "serve"])
def test_every_command_refuses_a_budget_below_one_position_in_one_line(command, capsys):
    extra = {"generate": ["--prompt", "hi"], "worker": ["--redis", "redis://127.0.0.1:1", "--service", "s"]}
    extra = extra.get(command, [])
    assert main([command, "--max-materialized-logits", "0", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--max-materialized-logits" in err and "at least 1" in err, err


def test_the_profiler_measures_with_the_budget_in_force():
    from engine_pod.models.row_invariant import TILE_ROWS
    from engine_pod.profiling.grid import Point
    from engine_pod.profiling.points import ProfileConfig, measure_point

    loaded = load_model(str(REFERENCE_DIR / "llada"))
    cfg = ProfileConfig(model="unused", block_length=BLOCK, steps=2, max_materialized_logits=5)
    calls = []
    head = loaded.model.lm_head
    handle = head.register_forward_hook(lambda module, inputs, output: calls.append(inputs[0].shape[0]))
    try:
        measure_point(loaded, Point(3, 24), cfg)
    finally:
        handle.remove()
    assert loaded.model.logit_budget.positions == 5
    assert (
        calls and max(calls) == TILE_ROWS
    )  # chunks of 5 positions, each padded to a tile of the head's rows
