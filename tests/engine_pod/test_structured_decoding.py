"""Structured outputs in the engine, on random weights of every family (float64): every constrained answer
that ends is in its grammar (its JSON parses and validates against its schema), a constrained request's
tokens are those it gets alone, and a free request's tokens are the same alone and beside constrained
rows, in BlockServe's batches and (LLaDA, Dream) in dLLM-Serve's staggered, step-level cycles."""

from __future__ import annotations

import json
import random
from functools import partial

import jsonschema
import pytest

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from dllm_contracts.structured_output import ResponseGrammar, json_grammar
from engine_pod.bench.structured_schemas import SCHEMAS
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.dllm_serve import DllmServeScheduler
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import run_workload

FAMILIES = {  # random preset -> its block length (DiffusionGemma's: its canvas)
    "llada-tiny": 8,
    "dream-tiny": 8,
    "llada2-tiny": 8,
    "sdar-tiny": 8,
    "diffusion-gemma-tiny": 32,
}
CONSTRAINED = ["person", "tags", "color", "score", "shape"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param, load_model(f"random:{request.param}", dtype="float64")


def _decoding(preset: str) -> DecodingConfig:
    block = FAMILIES[preset]
    return DecodingConfig(block_length=block, steps_per_block=block, threshold=0.6)


def _workload(loaded, block: int, seed: int):
    """Free requests (some sampled) and constrained ones (one sampled), their grammars and sampling."""
    rng = random.Random(seed)
    tokenizer = loaded.tokenizer
    workload, grammars, sampling = [], {}, {}
    for i in range(4):
        words = " ".join(
            rng.choice(["give", "me", "the", "json", "of", "a", "cat"]) for _ in range(rng.randint(1, 6))
        )
        workload.append((f"free{i}", tokenizer.encode(words), rng.randint(1, 3) * block))
        if i % 2:
            sampling[f"free{i}"] = RequestParams(temperature=0.8, top_p=0.9, seed=seed + i)
    for i, name in enumerate(CONSTRAINED):
        rid = f"json-{name}"
        workload.append((rid, tokenizer.encode(f"the {name} as json"), 64))
        grammars[rid] = ResponseGrammar(json_grammar(SCHEMAS[name][0]), "json_schema")
        if i == 1:
            sampling[rid] = RequestParams(temperature=0.7, seed=seed)
    return workload, grammars, sampling


def _check_valid(loaded, outputs: dict[str, list[int]], grammars) -> int:
    """Every constrained answer that ended validates; returns how many ended."""
    eos = set(loaded.config.eos_token_ids)
    ended = 0
    for rid in grammars:
        tokens = outputs[rid]
        end = next((i for i, t in enumerate(tokens) if t in eos), None)
        if end is None:
            continue
        ended += 1
        answer = json.loads(loaded.tokenizer.decode(tokens[:end]))
        jsonschema.validate(answer, SCHEMAS[rid.removeprefix("json-")][0])
    return ended


def test_constrained_answers_validate_and_batching_changes_no_row(family):
    preset, loaded = family
    decoding = _decoding(preset)
    block, eos = decoding.block_length, list(loaded.config.eos_token_ids)
    workload, grammars, sampling = _workload(loaded, block, seed=5)
    alone = run_workload(
        loaded,
        partial(sequential_scheduler, block, eos, layout="dense"),
        decoding,
        workload,
        sampling=sampling,
        grammars=grammars,
    )
    assert _check_valid(loaded, alone, grammars) >= 3  # most schemas end within their budget
    order = list(range(len(workload)))
    random.Random(1).shuffle(order)
    config = SchedulerConfig(token_budget=2000, layout="packed")
    blockserve = partial(BlockServeScheduler, block, eos, config)
    beside = run_workload(loaded, blockserve, decoding, workload, order, sampling=sampling, grammars=grammars)
    assert beside == alone  # free and constrained rows alike: each its tokens alone


@pytest.mark.parametrize("preset", ["llada-tiny", "dream-tiny"])
def test_dllm_serve_cycles_keep_free_rows_and_constrained_answers(preset):
    loaded = load_model(f"random:{preset}", dtype="float64")
    decoding = DecodingConfig(block_length=8, steps_per_block=8, threshold=0.6, remasking="threshold")
    eos = list(loaded.config.eos_token_ids)
    workload, grammars, sampling = _workload(loaded, 8, seed=9)
    alone = run_workload(
        loaded,
        partial(sequential_scheduler, 8, eos, layout="dense"),
        decoding,
        workload,
        sampling=sampling,
        grammars=grammars,
    )
    config = SchedulerConfig(
        token_budget=2000, refresh_quota=0.1, batch_refresh_quota=0.1, step_level=True, layout="packed"
    )
    staggered = run_workload(
        loaded,
        partial(DllmServeScheduler, 8, eos, config),
        decoding,
        workload,
        sampling=sampling,
        grammars=grammars,
    )
    assert staggered == alone
    assert _check_valid(loaded, staggered, grammars) >= 3
