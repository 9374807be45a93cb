"""Answers shorter than a block and than the steps per block, as each block-diffusion reference decodes
them: LLaDA2.0's generate caps the steps at the generation length (``min(steps, gen_length //
minimal_topk)``), SDAR's keeps them all. The reference runs with ``gen_length`` below ``steps`` through
``dllm generate`` and through BlockServe, each in one batch with a longer request of the same settings."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from functools import partial

import pytest

from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.cli.main import main
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.scheduler.blockserve import BlockServeScheduler
from tests.engine_pod.test_block_diffusion import ReferenceRun, _reference_runs
from tests.engine_utils import run_workload
from tests.factories import BLOCK_REFERENCE_DIR

FAMILIES = ["llada2", "sdar"]


def _short(family: str) -> list[ReferenceRun]:
    return [run for run in _reference_runs(family) if run.gen_length < run.steps]


def _expected(family: str, run: ReferenceRun, tokens: list[int]) -> list[int]:
    """The engine's tokens as the family's reference returns them: LLaDA2.0 the asked length, cut after
    the first EOS; SDAR whole blocks."""
    if family == "sdar":
        return tokens
    tokens = tokens[: run.gen_length]
    return tokens[: tokens.index(run.eos_id) + 1] if run.eos_id in tokens else tokens


@pytest.fixture(scope="module")
def models():
    return {family: load_model(str(BLOCK_REFERENCE_DIR / family)) for family in FAMILIES}


def test_the_vectors_hold_short_runs_of_both_families():
    assert all(len(_short(family)) >= 3 for family in FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_dllm_generate_gives_the_references_tokens_below_the_steps_per_block(family):
    for run in _short(family):
        argv = ["generate", "--model", str(BLOCK_REFERENCE_DIR / family), "--json"]
        argv += ["--prompt-ids", ",".join(map(str, run.prompt_ids)), "--gen-length", str(run.gen_length)]
        argv += ["--block-length", str(run.block_length), "--steps-per-block", str(run.steps)]
        argv += ["--threshold", str(run.threshold)]
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(argv) == 0
        payload = json.loads(out.getvalue())
        expected = run.output_ids[: run.gen_length]  # dllm generate answers the asked length
        assert payload["token_ids"][: len(expected)] == expected, run
        if family == "llada2":
            assert payload["num_forward_passes"] == run.forwards, run


@pytest.mark.parametrize("family", FAMILIES)
def test_blockserve_gives_the_references_tokens_below_the_steps_per_block(models, family):
    runs = _reference_runs(family)
    for short in _short(family):
        longer = next(
            (
                r
                for r in runs
                if r.gen_length > r.steps
                and (r.prompt_ids, r.block_length, r.steps, r.threshold)
                == (short.prompt_ids, short.block_length, short.steps, short.threshold)
            ),
            None,
        )
        pair = [short] if longer is None else [short, longer]
        decoding = DecodingConfig(
            block_length=short.block_length,
            steps_per_block=short.steps,
            remasking="scheduled_threshold",
            threshold=short.threshold,
        )
        workload = [(f"r{i}", run.prompt_ids, run.gen_length) for i, run in enumerate(pair)]
        scheduling = SchedulerConfig(token_budget=4096)
        scheduler = partial(BlockServeScheduler, short.block_length, [short.eos_id], scheduling)
        outputs = run_workload(models[family], scheduler, decoding, workload)
        for i, run in enumerate(pair):
            assert _expected(family, run, outputs[f"r{i}"]) == run.output_ids, run
