"""Tiny checkpoints the reference vectors never covered (other sizes, GQA, lengths, thresholds):
`dllm generate --json` agrees with an independent naive implementation of the reference samplers."""

from __future__ import annotations

import random

import pytest

from tests.engine_pod.test_reference_fidelity import run_generate
from tests.factories import dream_config, llada_config, write_checkpoint
from tests.naive_reference import NaiveModel, dream_block_generate, dream_original_generate, llada_generate

LLADA_CASES = [
    # (config overrides, prompt length, gen, block, steps, cache, threshold)
    (dict(d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, mlp=96), 9, 48, 16, 24, "dual", 0.7),
    (dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, mlp=64), 3, 32, 8, 32, "prefix", None),
    (dict(d_model=64, n_layers=2, n_heads=8, n_kv_heads=8, mlp=160), 17, 40, 20, 40, "none", 0.6),
    (dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp=80), 6, 32, 16, 16, "dual", 0.95),
    (dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, mlp=64), 11, 24, 8, 12, "none", None),
]
DREAM_CASES = [
    # (config overrides, prompt length, gen, block, steps, cache, remasking, threshold)
    (
        dict(hidden=48, layers=3, heads=6, kv_heads=3, intermediate=96),
        8,
        48,
        16,
        24,
        "dual",
        "threshold",
        0.8,
    ),
    (
        dict(hidden=32, layers=1, heads=4, kv_heads=1, intermediate=64),
        5,
        32,
        16,
        32,
        "prefix",
        "entropy",
        None,
    ),
    (
        dict(hidden=64, layers=2, heads=8, kv_heads=2, intermediate=128),
        14,
        24,
        24,
        12,
        "none",
        "topk_margin",
        None,
    ),
    (dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64), 4, 32, 8, 16, "dual", "entropy", None),
    (
        dict(hidden=32, layers=2, heads=4, kv_heads=4, intermediate=64),
        9,
        20,
        20,
        10,
        "none",
        "maskgit_plus",
        None,
    ),
]


@pytest.mark.parametrize("canvas", ["full", "block"])
@pytest.mark.parametrize("case_index", range(len(LLADA_CASES)))
def test_llada_unseen(tmp_path, case_index, canvas):
    """Both canvases: the full one (LLaDA's: the masked suffix is attended) and the block canvas that
    serving runs (the prompt, committed blocks and the active block only)."""
    overrides, prompt_len, gen, block, steps, cache, threshold = LLADA_CASES[case_index]
    model_dir = write_checkpoint(tmp_path / "m", llada_config(**overrides), seed=100 + case_index)
    prompt = [random.Random(case_index).randrange(480) for _ in range(prompt_len)]
    naive = NaiveModel(model_dir)
    expected, nfe = llada_generate(naive, prompt, gen, block, steps, cache, threshold, canvas)
    remasking = (
        ["--remasking", "low_confidence"]
        if threshold is None
        else ["--remasking", "threshold", "--threshold", str(threshold)]
    )
    options = [
        "--gen-length",
        str(gen),
        "--block-length",
        str(block),
        "--steps",
        str(steps),
        "--cache",
        cache,
        "--canvas",
        canvas,
        *remasking,
    ]
    result = run_generate(model_dir, prompt, options, dtype="float64")
    assert result["token_ids"] == expected
    assert result["num_forward_passes"] == nfe


@pytest.mark.parametrize("case_index", range(len(DREAM_CASES)))
def test_dream_unseen(tmp_path, case_index):
    overrides, prompt_len, gen, block, steps, cache, remasking, threshold = DREAM_CASES[case_index]
    model_dir = write_checkpoint(tmp_path / "m", dream_config(**overrides), seed=200 + case_index)
    prompt = [random.Random(50 + case_index).randrange(480) for _ in range(prompt_len)]
    naive = NaiveModel(model_dir)
    if cache == "none":
        expected, nfe = dream_original_generate(naive, prompt, gen, steps, remasking)
    else:
        expected, nfe = dream_block_generate(naive, prompt, gen, block, steps, cache == "dual", threshold)
    options = [
        "--gen-length",
        str(gen),
        "--block-length",
        str(block),
        "--steps",
        str(steps),
        "--cache",
        cache,
        "--canvas",
        "full",
        "--remasking",
        remasking,
    ]
    if threshold is not None:
        options += ["--threshold", str(threshold)]
    result = run_generate(model_dir, prompt, options, dtype="float64")
    assert result["token_ids"] == expected
    assert result["num_forward_passes"] == nfe
