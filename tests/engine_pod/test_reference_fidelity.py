"""Our LLaDA and Dream reproduce the reference logits and every reference decoding run."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from engine_pod.cli.main import main
from engine_pod.kinds.bidirectional.box_batches import box_refresh, box_window
from engine_pod.kinds.bidirectional.cycle_cache import CycleCache, CycleCachePool
from engine_pod.loading.loader import load_model
from tests.factories import REFERENCE_DIR, SHARED_REFERENCE, VENDORED_REFERENCE

FAMILIES = ["llada", "dream"]
LOGIT_ATOL = 1e-3


def _runs(family: str) -> list[dict]:
    return json.loads((REFERENCE_DIR / family / "generate.json").read_text())["runs"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, load_model(str(REFERENCE_DIR / request.param))


def test_full_forward_logits(family_model):
    family, loaded = family_model
    cases = json.loads((REFERENCE_DIR / family / "forward.json").read_text())["cases"]
    expected = load_file(str(REFERENCE_DIR / family / "logits.safetensors"))
    for case in cases:
        with torch.no_grad():
            logits = loaded.model(torch.tensor([case["input_ids"]]))[0]
        assert torch.allclose(logits, expected[case["logits_key"]], atol=LOGIT_ATOL), case["name"]
        assert logits.argmax(-1).tolist() == case["argmax"]


def test_cache_case_logits(family_model):
    family, loaded = family_model
    case = json.loads((REFERENCE_DIR / family / "forward.json").read_text())["cache_case"]
    expected = load_file(str(REFERENCE_DIR / family / "logits.safetensors"))
    x0, x1 = torch.tensor([case["x0"]]), torch.tensor([case["x1"]])
    s, e, n = case["block_start"], case["block_end"], x0.shape[1]
    model = loaded.model
    with torch.no_grad():
        full, cache = _refresh(model, x0)
        assert torch.allclose(full[0], expected[case["keys"]["full_x0"]], atol=LOGIT_ATOL)
        dual = _window(model, x1, cache, torch.arange(s, e)[None])
        assert torch.allclose(dual[0], expected[case["keys"]["dual_block_x1"]], atol=LOGIT_ATOL)
        _, cache = _refresh(model, x0)
        prefix = _window(model, x1, cache, torch.arange(s, n)[None])
        assert torch.allclose(prefix[0], expected[case["keys"]["prefix_suffix_x1"]], atol=LOGIT_ATOL)


def _refresh(model, x0: torch.Tensor):
    """One row's full forward filling a dual cache (the engine's own builder): its logits and the cache."""
    n = x0.shape[1]
    canvas = _canvas(x0)
    cache = CycleCache(CycleCachePool(lambda pages: model.new_pool(pages, 16, x0.device), 16, None))
    every = torch.arange(n)
    logits = model.forward_batch(box_refresh(canvas, None, cache), (every * 0, every)).logits()
    return logits[None], (cache, canvas)


def _window(model, x1: torch.Tensor, cached, columns: torch.Tensor) -> torch.Tensor:
    """The logits of ``x1``'s ``columns`` [1, W] from a window forward over ``cached``."""
    cache, canvas = cached
    canvas.tokens_with_scratch[:, :-1] = x1
    every = torch.arange(columns.shape[1])
    batch = box_window(canvas, cache, torch.zeros(1, dtype=torch.long), True, columns)
    return model.forward_batch(batch, (every * 0, every)).logits()[None]


def _canvas(x0: torch.Tensor) -> SimpleNamespace:
    """What the dual batches read of a canvas, for one unpadded row."""
    n = x0.shape[1]
    tokens = torch.cat([x0, torch.zeros(1, 1, dtype=torch.long)], 1)
    positions = torch.cat([torch.arange(n), torch.zeros(1, dtype=torch.long)])[None]
    return SimpleNamespace(
        tokens=tokens[:, :n],
        tokens_with_scratch=tokens,
        position_ids=positions[:, :n],
        positions_with_scratch=positions,
        key_mask=torch.ones(1, n, dtype=torch.bool),
    )


def reference_options(family: str, run: dict) -> list[str]:
    """The `dllm generate` options that README.md's mapping table gives for a reference run."""
    args, function = run["args"], run["function"]
    if family == "llada":
        gen, block = args["gen_length"], args["block_length"]
        cache = {"official_generate": "none", "fast_generate": "none"}.get(function)
        cache = cache or ("prefix" if "prefix" in function else "dual")
        remasking = ["--remasking", "low_confidence"]
        if args.get("threshold") is not None:
            remasking = ["--remasking", "threshold", "--threshold", str(args["threshold"])]
    elif function.startswith("dream_original"):
        gen = block = args["max_new_tokens"]
        cache, remasking = "none", ["--remasking", args["alg"]]
    else:
        gen, block = args["max_new_tokens"], args["block_length"]
        cache = "dual" if args["dual_cache"] else "prefix"
        if args["alg"] == "confidence_threshold":
            remasking = ["--remasking", "threshold", "--threshold", str(args["threshold"])]
        else:
            remasking = ["--remasking", "entropy"]
    return [
        "--gen-length",
        str(gen),
        "--block-length",
        str(block),
        "--steps",
        str(args["steps"]),
        *remasking,
        "--cache",
        cache,
        "--canvas",
        "full",  # the reference code keeps the masked suffix on the canvas
    ]


def run_generate(model_dir, prompt_ids: list[int], options: list[str], dtype: str = "float32") -> dict:
    argv = [
        "generate",
        "--model",
        str(model_dir),
        "--prompt-ids",
        ",".join(map(str, prompt_ids)),
        *options,
        "--ignore-eos",
        "--device",
        "cpu",
        "--dtype",
        dtype,
        "--json",
    ]
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        assert main(argv) == 0
    return json.loads(buffer.getvalue())


@pytest.mark.parametrize("family", FAMILIES)
def test_every_reference_run_through_dllm_generate(family):
    runs = _runs(family)
    assert len(runs) == 30
    for run in runs:
        result = run_generate(REFERENCE_DIR / family, run["prompt_ids"], reference_options(family, run))
        label = f"{family} {run['function']} {run['args'].get('alg', '')} prompt {run['prompt_index']}"
        assert result["token_ids"] == run["output_ids"], label
        assert result["num_forward_passes"] == run["nfe"], label


def test_vendored_vectors_are_the_shared_ones():
    """CI machines may lack ../shared: the copy in tests/data must be byte-identical to it."""
    vendored = sorted(p.relative_to(VENDORED_REFERENCE) for p in VENDORED_REFERENCE.rglob("*") if p.is_file())
    assert len(vendored) == 12
    if not SHARED_REFERENCE.is_dir():
        pytest.skip("../shared/reference is not on this machine; the vendored copy is used")
    for relative in vendored:
        assert (VENDORED_REFERENCE / relative).read_bytes() == (SHARED_REFERENCE / relative).read_bytes()
