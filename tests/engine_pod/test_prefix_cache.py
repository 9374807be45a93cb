"""The block prefix cache of block-diffusion models: what it shares, keeps and evicts, and that it never
changes a request's tokens (float64: greedy and seeded, alone and in mixed batches, across evictions and
preemptions, with follow-up turns that resend the conversation)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import LAYOUTS, SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.engine import Engine
from engine_pod.kinds.block_causal.prefix_cache import BlockPrefixCache
from engine_pod.loading.loader import load_model
from engine_pod.models.paged_kv import PagedKVPool
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.request import Request
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import built_for, tokens
from tests.factories import BLOCK_REFERENCE_DIR

VOCAB = 480


@pytest.fixture(scope="module")
def model():
    return load_model(str(BLOCK_REFERENCE_DIR / "llada2"), dtype="float64")


def _pool(pages: int, block: int = 4) -> PagedKVPool:
    return PagedKVPool(1, pages, block, 1, 2, torch.float32, torch.device("cpu"))


def test_a_row_shares_the_cached_run_of_whole_blocks_and_pages_outlive_their_request():
    pool = _pool(8)
    cache = BlockPrefixCache(pool, 4)
    first = list(range(10))  # blocks [0..3], [4..7], then a partial block
    assert cache.attach("a", first) == 0
    pool.reserve("a", 12)
    cache.extend("a", first, 8)
    assert cache.stats.cached_tokens == 8
    kept = pool.table("a")[:2]
    pool.release("a")
    cache.detach("a")
    assert pool.free_pages == 8 - 2  # the two cached blocks stay
    second = list(range(8)) + [99, 98, 97, 96, 95]
    assert cache.attach("b", second) == 8
    assert pool.table("b") == kept
    assert cache.attach("c", [0, 1, 2, 3, 9, 9, 9, 9]) == 4  # diverges in its second block
    assert cache.stats.hit_tokens == 12 and cache.stats.looked_up_tokens == 8 + 12 + 8


def test_unused_blocks_are_evicted_least_recently_used_first_and_used_ones_never():
    pool = _pool(4)
    cache = BlockPrefixCache(pool, 4)
    for owner, base in (("old", 100), ("new", 200), ("busy", 300)):
        tokens = [base + i for i in range(4)]
        cache.attach(owner, tokens)
        pool.reserve(owner, 4)
        cache.extend(owner, tokens, 4)
        if owner != "busy":
            pool.release(owner)
            cache.detach(owner)
    assert pool.free_pages == 1
    pool.reserve("x", 8)  # needs one more page than is free: the oldest unused block goes
    assert cache.stats.evicted_tokens == 4
    assert cache.attach("y", [100, 101, 102, 103]) == 0
    assert cache.attach("z", [200, 201, 202, 203]) == 4
    with pytest.raises(Exception, match="KV pages"):
        pool.reserve("w", 12)  # "busy" and "z" hold theirs: nothing more to evict


def test_pinned_blocks_are_never_evicted_and_count_once():
    pool = _pool(4)
    cache = BlockPrefixCache(pool, 4)
    warm = list(range(8))
    pool.reserve("warm", 12)
    cache.extend("warm", warm, 8)
    assert cache.pin(warm) == 8 and cache.pin(warm[:4]) == 0  # the second pins nothing new
    pool.release("warm")
    cache.detach("warm")
    cache.clear()
    assert cache.stats.cached_tokens == cache.stats.pinned_tokens == 8
    with pytest.raises(Exception, match="KV pages"):
        pool.reserve("x", 12)  # two pages are free; the pinned two are not taken back
    assert cache.attach("y", [*warm, 50]) == 8
    with pytest.raises(ValueError, match="not cached"):
        cache.pin([9, 9, 9, 9])


def test_a_warm_prefix_comes_out_of_the_budget_once():
    """Its tokens leave the budget; a row starting with it costs only what follows (packed)."""
    scheduler = BlockServeScheduler(4, [0], SchedulerConfig(40), grid_aligned=True, shares_blocks=True)
    warm = list(range(1, 17))
    assert scheduler.pin_prefix(warm) == 16 and scheduler.pin_prefix(warm[:8]) == 0
    assert scheduler.token_budget == 24
    rows = [scheduler.request_for(f"r{i}", [*warm, 90 + i], tokens(4)) for i in range(4)]
    for row in rows:
        scheduler.add(row)
    assert len(scheduler.schedule().request_ids) == 4  # each holds 1 + 4 beyond the pinned 16: 20 of 24
    alone = scheduler.request_for("long", list(range(100, 129)), tokens(4))
    assert not scheduler.fits(alone)  # 28 whole + 4 would fit 40, not the 24 left


@dataclass(frozen=True)
class Turn:
    request_id: str
    prompt: list[int]  # a follow-up's own message (the history goes before it)
    budget: int
    follows: str | None = None
    sampling: RequestParams | None = None


def _conversations(rng: random.Random, block: int, count: int, seeded: bool) -> list[Turn]:
    """Requests that begin alike (one stem, cut at various lengths) and chats of up to three turns."""
    stem = [rng.randrange(VOCAB) for _ in range(rng.randint(block, 4 * block))]
    turns = []
    for i in range(count):
        prompt = stem[: rng.randint(1, len(stem))] + [rng.randrange(VOCAB) for _ in range(rng.randint(0, 6))]
        previous = None
        for t in range(rng.randint(1, 3)):
            sampling = (
                RequestParams(temperature=1.0, seed=rng.randrange(2**31))
                if seeded and rng.random() < 0.5
                else None
            )
            turn = Turn(f"r{i}-{t}", prompt, rng.randint(1, 2) * block, previous, sampling)
            turns.append(turn)
            previous, prompt = turn.request_id, [rng.randrange(VOCAB) for _ in range(rng.randint(1, 5))]
    return turns


def _run(model, scheduler, decoding: DecodingConfig, turns: list[Turn], pool_tokens: int):
    """Every turn's tokens (a follow-up sent when the turn before it finishes), and the runner."""
    runner = make_runner(model, decoding, pool_tokens)
    scheduler = built_for(scheduler, runner)
    engine = Engine(runner, scheduler)
    waiting = {t.follows: t for t in turns if t.follows is not None}
    prompts = {}

    def add(turn: Turn, history: list[int]) -> None:
        prompts[turn.request_id] = history + turn.prompt
        params = tokens(turn.budget, turn.sampling)
        engine.add_request(scheduler.request_for(turn.request_id, prompts[turn.request_id], params))

    outputs: dict[str, list[int]] = {}

    def finished(request: Request) -> None:
        outputs[request.request_id] = list(request.generated)
        nxt = waiting.get(request.request_id)
        if nxt is not None:
            add(nxt, prompts[request.request_id] + request.generated[: request.max_tokens])

    for turn in turns:
        if turn.follows is None:
            add(turn, [])
    engine.run(finished)
    return outputs, runner, engine


def _peak(turns: list[Turn], block: int) -> int:
    """The widest row any turn can have (its whole history included)."""
    lengths: dict[str, int] = {}
    for turn in turns:
        history = lengths.get(turn.follows, 0) if turn.follows else 0
        lengths[turn.request_id] = history + len(turn.prompt) + turn.budget + block
    return max(lengths.values())


cases = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "requests": st.integers(2, 6),
        "block": st.sampled_from([4, 8]),
        "threshold": st.sampled_from([0.3, 0.6, 1.0]),
        "budget_slack": st.integers(0, 60),
        "admission": st.sampled_from(["preempt", "projected"]),
        "layout": st.sampled_from(LAYOUTS),
        "seeded": st.booleans(),
    }
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases)
def test_the_prefix_cache_never_changes_a_requests_tokens(model, case):
    """float64: BlockServe with the cache (shared prefixes, follow-ups hitting finished turns, a pool of the
    budget's size, so blocks are evicted and rows preempted) gives every request its tokens alone, without
    the cache."""
    rng = random.Random(case["seed"])
    block = case["block"]
    turns = _conversations(rng, block, case["requests"], case["seeded"])
    decoding = DecodingConfig(
        block_length=block,
        steps_per_block=block // 2,
        remasking="scheduled_threshold",
        threshold=case["threshold"],
        cache="dual",
    )
    off = DecodingConfig(**{**decoding.__dict__, "prefix_cache": False})
    budget = _peak(turns, block) + case["budget_slack"]
    alone, _, _ = _run(model, partial(sequential_scheduler, block, []), off, turns, budget)
    scheduling = SchedulerConfig(token_budget=budget, admission=case["admission"], layout=case["layout"])
    shared, runner, _ = _run(
        model, partial(BlockServeScheduler, block, [], scheduling), decoding, turns, budget
    )
    assert shared == alone
    assert runner.stepper.prefix_cache is not None and runner.stepper.prefix_cache.stats.attached_rows >= len(
        turns
    )


def test_shared_blocks_are_hit_evicted_and_survive_preemption_with_the_same_tokens(model):
    """A tight budget: rows are preempted and resumed, cached blocks evicted, follow-ups hit their history;
    the tokens are those of the cache off."""
    block, rng = 4, random.Random(7)
    turns = _conversations(rng, block, 6, seeded=True)
    decoding = DecodingConfig(
        block_length=block, steps_per_block=2, remasking="scheduled_threshold", threshold=0.6
    )
    off = DecodingConfig(**{**decoding.__dict__, "prefix_cache": False})
    budget = _peak(turns, block)
    scheduling = SchedulerConfig(token_budget=budget, admission="preempt")
    without, _, _ = _run(model, partial(BlockServeScheduler, block, [], scheduling), off, turns, budget)
    shared, runner, engine = _run(
        model, partial(BlockServeScheduler, block, [], scheduling), decoding, turns, budget
    )
    assert shared == without
    stats = runner.stepper.prefix_cache.stats
    assert stats.hit_tokens > 0 and stats.evicted_tokens > 0
    assert sum(record.preempted for record in engine.records) > 0
    assert max(record.cost for record in engine.records) <= budget
