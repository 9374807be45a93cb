"""DiffusionGemma's context in pages of one pool (models/diffusion_gemma/context_cache.py, the runner's
pool in kinds/canvas/stepper.py): the pool is sized by the token budget, released and preempted requests
give their pages back, a BlockServe run with preemption never holds more pages than the pool has (nor
leaks one), and a context laid over many pages, out of order, gives the logits of one laid in order."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.engine import Engine
from engine_pod.kinds.canvas.context_cache import ContextCache, context_pool
from engine_pod.loading.loader import load_model
from engine_pod.runner.contract import scheduling_facts
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from tests.engine_utils import tokens

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "diffusion_gemma_reference"
TRACE = json.loads((REFERENCE / "trace.json").read_text())
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def base():
    return load_model(str(REFERENCE))


def _pages(tokens: int, page: int = 16) -> int:
    return -(-tokens // page)


def test_the_pool_is_sized_by_the_token_budget(base):
    runner = make_runner(base, DecodingConfig(block_length=16, steps_per_block=2), pool_tokens=100)
    assert runner.stepper.pool.free_pages == _pages(100) and runner.stepper.pool.page_size == 16
    shapes = [tuple(keys.shape[1:]) for keys in runner.stepper.pool.keys]
    assert shapes == [(2, 16), (2, 16), (1, 32)]  # sliding layers' heads, the full layer's wider one


def test_released_and_preempted_requests_give_their_pages_back(base):
    runner = make_runner(base, DecodingConfig(block_length=16, steps_per_block=2), pool_tokens=256)
    pool, total = runner.stepper.pool, runner.stepper.pool.free_pages
    a, b = CycleRow((3, 4, 5), owner="a"), CycleRow((6, 7), owner="b")
    first = runner.run(SchedulerOutput.of_rows([a, b]))
    assert len(pool.table("a")) == len(pool.table("b")) == 1 and pool.free_pages == total - 2
    grown = CycleRow(a.prefix_ids + tuple(first.blocks[0]), owner="a")  # 19 tokens: a second page
    second = SchedulerOutput.of_rows([grown])
    second.released = ["b"]
    runner.run(second)
    assert not pool.table("b") and len(pool.table("a")) == 2 and pool.free_pages == total - 2
    third = SchedulerOutput.of_rows([CycleRow((8,), owner="c")])
    third.released, third.preempted = ["a"], ["a"]
    runner.run(third)
    assert not pool.table("a") and len(pool.table("c")) == 1 and pool.free_pages == total - 1
    back = SchedulerOutput.of_rows([CycleRow((8,), owner="c"), grown])  # rebuilt at its return
    assert runner.run(back) and len(pool.table("a")) == 2 and runner.stepper.states["a"].cache.length == 19
    runner.forget()
    assert pool.free_pages == total


def _held_pages(runner) -> int:
    """Pages the runner's requests hold, each checked against its context (no page lost or kept)."""
    for owner, state in runner.stepper.states.items():
        assert len(runner.stepper.pool.table(owner)) == _pages(state.cache.length), owner
    return sum(len(runner.stepper.pool.table(owner)) for owner in runner.stepper.states)


def test_a_blockserve_run_with_preemption_stays_within_the_pools_pages(base):
    """A tight budget over requests that grow past it: rows are preempted and come back, and at every
    cycle the pages held are those of the rows' contexts, never more than the budget's pages."""
    rng = random.Random(3)
    workload = [(str(i), [rng.randrange(3, 256) for _ in range(rng.randint(1, 40))], 64) for i in range(6)]
    budget = max(len(prompt) + gen for _, prompt, gen in workload) + 40
    runner = make_runner(base, DecodingConfig(block_length=16, steps_per_block=3), pool_tokens=budget)
    config = SchedulerConfig(token_budget=budget, admission="preempt")
    scheduler = BlockServeScheduler(16, [], config, ignore_eos=True, **scheduling_facts(runner))
    engine = Engine(runner, scheduler)
    for request_id, prompt, gen in workload:
        engine.add_request(scheduler.request_for(request_id, prompt, tokens(gen, seed=int(request_id))))
    held, run = [], runner.run

    def counted(cycle: SchedulerOutput):
        output = run(cycle)
        held.append(_held_pages(runner))
        return output

    runner.run = counted
    engine.run()
    assert sum(record.preempted for record in engine.records) >= 1
    assert max(held) <= _pages(budget) and max(held) > _pages(budget) // 2
    runner.forget()
    assert runner.stepper.pool.free_pages == _pages(budget)


def _trace_logits(model, cache: ContextCache, before=lambda: None) -> list[torch.Tensor]:
    """The decoder's logits at every step of the trace run over ``cache`` (its context written as the
    reference wrote it), ``before`` called ahead of each encoder forward."""
    run, length = TRACE["run"], TRACE["run"]["args"]["canvas_length"]
    chunks = [run["prompt_ids"], run["output_ids"][:length], list(range(3, 40))]  # the last: several pages
    logits = []
    for chunk in chunks:
        before()
        model.encode(torch.tensor([chunk]), cache)
        for step in TRACE["steps"][:3]:
            logits.append(model.denoise(torch.tensor([step["canvas_input"]]), cache))
    return logits


def test_a_context_over_many_pages_out_of_order_gives_the_same_logits(base):
    """Pages of 3 positions, interleaved with another request's and handed out in reverse, against one
    pool of pages as long as the canvas: every logit bit for bit, in the sliding and the full layers."""
    model, config = base.model, base.config
    alone = _trace_logits(model, ContextCache.alone(config, 128, torch.float32, CPU))
    pool = context_pool(config, 64, 3, torch.float32, CPU)
    pool.reserve("x", 30)
    pool.reserve("y", 30)
    pool.release("x")
    pool.release("y")  # the free list now hands out y's pages, then x's
    others = iter(range(100))
    cache = ContextCache(pool, "request", config)
    paged = _trace_logits(model, cache, lambda: pool.reserve(f"other-{next(others)}", 4))
    table = pool.table("request")
    assert len(table) > 20 and table != sorted(table)
    assert all(torch.equal(ours, expected) for ours, expected in zip(paged, alone, strict=True))


def test_the_rows_of_one_forward_keep_their_contexts_in_one_pool(base):
    caches = [ContextCache.alone(base.config, 16, torch.float32, CPU) for _ in range(2)]
    for cache in caches:
        base.model.encode(torch.tensor([[5, 6, 7]]), cache)
    with pytest.raises(ValueError, match="one pool"):
        base.model.denoise(torch.zeros(2, 16, dtype=torch.long), caches)
