"""DiffusionGemma's context encoder a chunk per cycle (kinds/canvas/prefill_chunk.py), float64: every
request's tokens (greedy and seeded) are those of its context encoded whole, alone and in BlockServe
batches beside short requests, in chunks smaller than the sliding window (every chunk's first queries
reach back into the chunk before) and larger than it; a cycle encodes at most one chunk."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
import torch

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.kinds.canvas.context_cache import ContextCache
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import run_engine, run_workload

LONG = 300  # context tokens: past the window (128), no multiple of the canvas (32)


@pytest.fixture(scope="module")
def gemma64():
    return load_model("random:diffusion-gemma-tiny", dtype="float64")


def _workload(canvas: int):
    """Two long prompts among four short ones, two canvases each; seeded and greedy among both."""
    longs = [(f"long{n}", [3 + (7 * i + 13 * n) % 1000 for i in range(LONG + n)], 2 * canvas) for n in (0, 5)]
    shorts = [(f"short{n}", [5 + (11 * i + n) % 900 for i in range(n)], 2 * canvas) for n in (9, 20, 33, 40)]
    sampling = {
        "long5": RequestParams(seed=11),
        "short20": RequestParams(seed=5),
        "short40": RequestParams(seed=7),
    }
    return longs[:1] + shorts[:2] + longs[1:] + shorts[2:], sampling


def _decoding(canvas: int) -> DecodingConfig:
    return DecodingConfig(block_length=canvas, steps_per_block=6)


@pytest.fixture(scope="module")
def alone(gemma64):
    """Each request by itself, its context encoded whole."""
    canvas = gemma64.config.canvas_length
    workload, sampling = _workload(canvas)
    scheduler = partial(sequential_scheduler, canvas, [])
    return run_workload(gemma64, scheduler, _decoding(canvas), workload, None, sampling)


def _blockserve(gemma64, chunk: int, workload, sampling):
    canvas = gemma64.config.canvas_length
    config = SchedulerConfig(token_budget=4096, prefill_chunk=chunk)
    scheduler = partial(BlockServeScheduler, canvas, [], config)
    return run_engine(gemma64, scheduler, _decoding(canvas), workload, None, sampling)


@pytest.mark.parametrize("chunk", [64, 160])
def test_chunked_contexts_give_the_tokens_of_whole_ones_in_a_batch(gemma64, alone, chunk):
    workload, sampling = _workload(gemma64.config.canvas_length)
    whole, plain = _blockserve(gemma64, 0, workload, sampling)
    chunked, engine = _blockserve(gemma64, chunk, workload, sampling)
    assert chunked == whole == alone
    assert sum(r.prefill_chunks for r in plain.records) == 0
    records = engine.records
    assert sum(r.prefill_chunk_tokens for r in records) == sum(
        ((LONG + n - 1) // chunk) * chunk for n in (0, 5)
    )
    assert (
        max(r.prefill_chunks for r in records) == 1
    )  # one chunk a cycle, the second prompt's after the first's
    assert all(r.prefill_chunk_tokens <= chunk for r in records)


def test_a_chunked_context_alone_gives_the_tokens_of_a_whole_one(gemma64, alone):
    workload, sampling = _workload(gemma64.config.canvas_length)
    for item in [w for w in workload if w[0].startswith("long")]:
        chunked, engine = _blockserve(gemma64, 64, [item], sampling)
        assert chunked == {item[0]: alone[item[0]]}
        assert sum(r.prefill_chunks for r in engine.records) == (len(item[1]) - 1) // 64


def _context(pool, owner: str, tokens: int) -> list[torch.Tensor]:
    """Every layer's keys and values of ``owner``'s first ``tokens`` context positions in ``pool``."""
    slots = pool.slots(owner, 0, tokens)
    return [store[slots] for stores in (pool.keys, pool.values) for store in stores]


@pytest.mark.parametrize("chunk", [64, 96, 160])
def test_a_context_encoded_in_chunk_rows_holds_the_keys_and_values_of_one_encoded_whole(gemma64, chunk):
    """Chunk rows beside decoding rows, cycle after cycle, then the row's first canvas: its context's keys
    and values in every layer are those of the context encoded in one forward (to float64's rounding: the
    chunks' attention calls sum in another order), and so is that canvas. A chunk's keys and values reach
    every later layer, so a chunk that missed a key of its window or took a wrong position would be off by
    far more."""
    canvas = gemma64.config.canvas_length
    decoding = _decoding(canvas)
    prompt = tuple(3 + (7 * i) % 1000 for i in range(LONG))
    long = CycleRow(prompt, owner="long", params=RequestParams(max_tokens=canvas), prompt_len=LONG)
    shorts = [
        CycleRow(tuple(range(5, 5 + n)), owner=f"short{n}", params=RequestParams(max_tokens=8 * canvas))
        for n in (9, 30)
    ]
    runner = make_runner(gemma64, decoding, pool_tokens=4096)
    for end in range(chunk, LONG, chunk):  # the scheduler's chunk ends: what is left goes with the canvas
        ran = runner.run(SchedulerOutput.of_rows([*shorts, replace(long, prefill_to=end)]))
        assert ran.blocks[-1] is None and ran.stats.prefill_chunk_tokens == chunk
        shorts = [replace(row, prefix_ids=row.prefix_ids + tuple(b)) for row, b in zip(shorts, ran.blocks)]
    chunked = runner.run(SchedulerOutput.of_rows([*shorts, long])).blocks[-1]
    pool = runner.stepper.pool
    whole_runner = make_runner(gemma64, decoding, pool_tokens=4096)
    whole = whole_runner.run(SchedulerOutput.of_rows([long])).blocks[0]
    alone = ContextCache.alone(gemma64.config, LONG, torch.float64, torch.device("cpu"))
    gemma64.model.encode_chunks([prompt], [alone])
    for got, want in zip(_context(pool, "long", LONG), _context(alone.pool, "alone", LONG), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert chunked == whole
