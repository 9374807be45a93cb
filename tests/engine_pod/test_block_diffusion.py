"""LLaDA2.0 (block diffusion, mixture of experts): the reference logits and decoding runs reproduced token
for token, and the exact KV cache giving what recomputing the whole context gives."""

from __future__ import annotations

import io
import json
import random
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine_pod.block_diffusion.generate import generate_blocks
from engine_pod.cli.main import main
from engine_pod.models.block_transformer import BlockForward
from engine_pod.models.config import ModelConfigError, config_from_dict
from engine_pod.models.loader import load_model

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "block_reference" / "llada2"
LOGIT_ATOL = 1e-3


def _runs() -> list[dict]:
    return json.loads((REFERENCE / "generate.json").read_text())["runs"]


@pytest.fixture(scope="module")
def loaded():
    return load_model(str(REFERENCE))


def _whole_sequence_logits(model, ids: list[int], block_length: int) -> torch.Tensor:
    """One block-causal forward over the whole sequence, through the paged pool."""
    n = len(ids)
    pool = model.new_pool(-(-n // 16), 16, torch.device("cpu"))
    pool.reserve("case", n)
    slots = pool.slots("case", 0, n)[None]
    positions = torch.arange(n)
    mask = (positions[None, :] // block_length <= positions[:, None] // block_length)[None]
    batch = BlockForward(torch.tensor([ids]), positions[None], slots, slots, mask, pool)
    with torch.no_grad():
        return model.forward_blocks(batch, (torch.zeros(n, dtype=torch.long), positions)).logits()


def test_block_causal_forward_logits(loaded):
    expected = load_file(str(REFERENCE / "logits.safetensors"))
    for case in json.loads((REFERENCE / "forward.json").read_text())["cases"]:
        logits = _whole_sequence_logits(loaded.model, case["input_ids"], case["block_length"])
        assert torch.allclose(logits, expected[case["logits_key"]], atol=LOGIT_ATOL), case["name"]
        assert logits.argmax(-1).tolist() == case["argmax"], case["name"]


def _generate(loaded, run: dict, exact_cache: bool = True):
    args = run["args"]
    model = loaded if args["eos_id"] in loaded.config.eos_token_ids else _with_eos(loaded, args["eos_id"])
    return generate_blocks(
        model,
        run["prompt_ids"],
        args["gen_length"],
        args["block_length"],
        args["steps"],
        args["threshold"],
        exact_cache=exact_cache,
    )


def _with_eos(loaded, eos: int):
    from dataclasses import replace

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
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(
            [
                "generate",
                "--model",
                str(REFERENCE),
                "--prompt-ids",
                ",".join(map(str, run["prompt_ids"])),
                "--gen-length",
                str(args["gen_length"]),
                "--block-length",
                str(args["block_length"]),
                "--steps",
                str(steps),
                "--threshold",
                str(args["threshold"]),
                "--json",
            ]
        )
    assert code == 0
    payload = json.loads(out.getvalue())
    assert payload["token_ids"][: len(run["output_ids"])] == run["output_ids"]
    assert payload["num_forward_passes"] == run["nfe"]


def test_the_exact_cache_gives_the_tokens_of_recomputing_the_whole_context():
    """float64, where a flip would need a near-tie: random prompts, block lengths, steps and thresholds."""
    model = load_model(str(REFERENCE), dtype="float64")
    rng = random.Random(11)
    for _ in range(12):
        prompt = [rng.randrange(480) for _ in range(rng.randint(1, 20))]
        block_length = rng.choice([2, 4, 8])
        steps = rng.randint(1, block_length)
        gen_length = block_length * rng.randint(1, 4)
        threshold = rng.choice([0.2, 0.5, 0.9, 1.0])
        cached = generate_blocks(model, prompt, gen_length, block_length, steps, threshold, exact_cache=True)
        full = generate_blocks(model, prompt, gen_length, block_length, steps, threshold, exact_cache=False)
        assert cached.output_ids == full.output_ids, (prompt, block_length, steps, threshold)
        assert cached.forwards == full.forwards


def test_a_config_the_reference_code_does_not_implement_is_refused():
    raw = json.loads((REFERENCE / "config.json").read_text())
    with pytest.raises(ModelConfigError, match="score_function"):
        config_from_dict({**raw, "score_function": "softmax"})
    with pytest.raises(ModelConfigError, match="groups"):
        config_from_dict({**raw, "n_group": 3})
    config = config_from_dict(raw)
    assert config.block_diffusion and config.moe.num_experts == 8 and config.rotary_dim == 8
