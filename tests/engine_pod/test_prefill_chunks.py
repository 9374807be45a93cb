"""Chunked prefill for the block-diffusion families (LLaDA2.0, SDAR): a long prompt's keys and values a
chunk per cycle, beside decoding rows. float64: every request's tokens (greedy and seeded) are those of
the prompt computed whole, alone and in batches, with the prefix cache sharing whole blocks and rows
preempted; chunk rows commit nothing, and their cycles say how many chunks ran."""

from __future__ import annotations

import random
from functools import partial

import pytest

from dllm_contracts.scheduler_config import LAYOUTS, SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.decoding.sampling_params import SamplingParams
from engine_pod.engine import Engine
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.prefill_chunks import prefill_chunk_tokens
from engine_pod.scheduler.request import Request
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import built_for
from tests.factories import BLOCK_REFERENCE_DIR

VOCAB, BLOCK = 480, 4


@pytest.fixture(scope="module", params=["llada2", "sdar"])
def model(request):
    return load_model(str(BLOCK_REFERENCE_DIR / request.param), dtype="float64")


def _workload(rng: random.Random, count: int, seeded: bool):
    """Long prompts (some sharing a stem: the prefix cache's) among short ones."""
    stem = [rng.randrange(VOCAB) for _ in range(13 * BLOCK)]
    items = []
    for i in range(count):
        if i % 2:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 2 * BLOCK))]
        else:
            prompt = stem[: rng.randint(8 * BLOCK, len(stem))] + [
                rng.randrange(VOCAB) for _ in range(rng.randint(0, 7))
            ]
        sampling = SamplingParams(1.0, seed=rng.randrange(2**31)) if seeded and rng.random() < 0.5 else None
        items.append((f"r{i}", prompt, rng.randint(1, 3) * BLOCK, sampling))
    return items


def _run(model, scheduler, decoding: DecodingConfig, items, pool_tokens: int):
    runner = make_runner(model, decoding, pool_tokens)
    scheduler = built_for(scheduler, runner)
    engine = Engine(runner, scheduler)
    for request_id, prompt, budget, sampling in items:
        request = scheduler.request_for(request_id, prompt, budget)
        request.sampling = sampling
        engine.add_request(request)
    outputs: dict[str, list[int]] = {}

    def finished(request: Request) -> None:
        outputs[request.request_id] = list(request.generated)

    engine.run(finished)
    return outputs, engine


def _decoding(prefix_cache: bool) -> DecodingConfig:
    return DecodingConfig(
        block_length=BLOCK,
        steps_per_block=BLOCK,
        remasking="scheduled_threshold",
        threshold=0.6,
        cache="dual",
        prefix_cache=prefix_cache,
    )


@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("prefix_cache", [False, True])
def test_chunked_prompts_give_the_tokens_of_whole_ones(model, seeded, layout, prefix_cache):
    rng = random.Random(11 + seeded)
    items = _workload(rng, 6, seeded)
    budget = sum(len(p) + b + 2 * BLOCK for _, p, b, _ in items)
    decoding = _decoding(prefix_cache)
    alone, _ = _run(model, partial(sequential_scheduler, BLOCK, []), _decoding(False), items, budget)
    whole = SchedulerConfig(token_budget=budget, layout=layout, prefill_chunk=0)
    unchunked, plain = _run(model, partial(BlockServeScheduler, BLOCK, [], whole), decoding, items, budget)
    chunked_config = SchedulerConfig(token_budget=budget, layout=layout, prefill_chunk=2 * BLOCK)
    chunked, engine = _run(
        model, partial(BlockServeScheduler, BLOCK, [], chunked_config), decoding, items, budget
    )
    assert chunked == unchunked == alone
    assert sum(r.prefill_chunks for r in engine.records) > 0
    assert sum(r.prefill_chunks for r in plain.records) == 0
    assert all(r.prefill_chunk_tokens <= r.prefill_chunks * 2 * BLOCK for r in engine.records)


def test_chunked_prefill_survives_preemption_with_the_same_tokens(model):
    """A budget that holds about one long row: rows are preempted mid-prefill and start their chunks again."""
    rng = random.Random(5)
    items = _workload(rng, 6, seeded=True)
    decoding = _decoding(prefix_cache=True)
    budget = max(len(p) + b + 2 * BLOCK for _, p, b, _ in items) + BLOCK
    alone, _ = _run(model, partial(sequential_scheduler, BLOCK, []), _decoding(False), items, budget)
    config = SchedulerConfig(token_budget=budget, admission="preempt", prefill_chunk=BLOCK)
    chunked, engine = _run(model, partial(BlockServeScheduler, BLOCK, [], config), decoding, items, budget)
    assert chunked == alone
    assert sum(r.prefill_chunks for r in engine.records) > 0
    assert max(r.cost for r in engine.records) <= budget


def test_the_default_chunk_is_whole_blocks_within_the_budget():
    assert prefill_chunk_tokens(None, 32, 32768) == 512
    assert prefill_chunk_tokens(None, 32, 1024) == 128
    assert prefill_chunk_tokens(None, 32, 100) == 32  # at least one block
    assert prefill_chunk_tokens(100, 32, 32768) == 96
    assert prefill_chunk_tokens(0, 32, 32768) == 0
