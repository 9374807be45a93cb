"""A long row's dual-cache refresh split across cycles (scheduler/split_refresh.py,
kinds/bidirectional/split_refresh.py): LLaDA's rows wider than the chunk compute their refresh a few layers
per cycle beside the decoding rows, then decode their block over the cache the pieces computed. float64:
every request's tokens (greedy and seeded) are those it gets alone and with every refresh computed whole,
under BlockServe and dLLM-Serve; no cycle's forward refreshes a split row whole; the pieces follow the
rule (as many as the row has chunks, at most one per layer); Dream, whose block starts at the position
before it, is not split."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.kinds.bidirectional.phase_plan import plan_phases
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.dllm_serve import DllmServeScheduler
from engine_pod.scheduler.split_refresh import SplitRefreshes
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import run_engine
from tests.factories import REFERENCE_DIR

BLOCK, BUDGET, CHUNK = 8, 1200, 40
DECODING = DecodingConfig(block_length=BLOCK, steps_per_block=4, cache="dual", threshold=0.6)
LONG = 300  # a long prompt: its refresh wider than the chunk, and than all short rows together


@pytest.fixture(scope="module")
def llada():
    return load_model(str(REFERENCE_DIR / "llada"), dtype="float64")


def _workload(seed: int):
    """Two long prompts among short ones; every other request sampled with its own seed."""
    rng = random.Random(seed)
    items = []
    for i in range(7):
        width = LONG + rng.randint(0, 20) if i in (1, 4) else rng.randint(1, CHUNK - BLOCK)
        items.append((f"r{i}", [rng.randrange(480) for _ in range(width)], rng.randint(1, 3) * BLOCK))
    sampling = {
        rid: RequestParams(temperature=0.8, top_p=0.9, seed=seed + i)
        for i, (rid, _, _) in enumerate(items)
        if i % 2
    }
    return items, sampling


@pytest.mark.parametrize("policy", [BlockServeScheduler, DllmServeScheduler])
def test_split_refreshes_give_each_request_its_tokens_alone(llada, policy):
    items, sampling = _workload(3)
    alone, _ = run_engine(
        llada, sequential_scheduler(BLOCK, [], ignore_eos=True), DECODING, items, sampling=sampling
    )
    outputs, records = {}, {}
    for chunk in (0, CHUNK):
        config = SchedulerConfig(token_budget=BUDGET, prefill_chunk=chunk)
        scheduler = partial(policy, BLOCK, [], config, ignore_eos=True)
        outputs[chunk], engine = run_engine(llada, scheduler, DECODING, items, sampling=sampling)
        records[chunk] = list(engine.records)
    assert outputs[CHUNK] == outputs[0] == alone
    # whole: some forward refreshes a long row; split: its pieces ran, and no forward refreshes it whole
    assert max(r.peak_refresh_positions for r in records[0]) >= LONG
    assert sum(r.prefill_chunks for r in records[0]) == 0
    assert sum(r.prefill_chunks for r in records[CHUNK]) > 0
    assert max(r.peak_refresh_positions for r in records[CHUNK]) < LONG


def test_a_long_rows_pieces_run_one_a_cycle_then_its_block_decodes(llada):
    """The reference LLaDA has 2 layers: a long row's block takes 2 piece cycles (committing nothing),
    then a cycle that decodes it; short rows beside it commit a block in every cycle."""
    runner = make_runner(llada, DECODING, BUDGET)
    assert runner.refresh_layers == llada.config.num_layers == 2
    config = SchedulerConfig(token_budget=BUDGET, prefill_chunk=CHUNK)
    scheduler = BlockServeScheduler(BLOCK, [], config, ignore_eos=True, refresh_layers=2)
    long_prompt, short_prompt = list(range(3, 3 + LONG)), [5, 6, 7]
    scheduler.add(scheduler.request_for("long", long_prompt, RequestParams(max_tokens=2 * BLOCK)))
    scheduler.add(scheduler.request_for("short", short_prompt, RequestParams(max_tokens=3 * BLOCK)))
    splits, generated = [], []
    while scheduler.has_unfinished():
        cycle = scheduler.schedule()
        rows = dict(zip(cycle.request_ids, cycle.rows))
        splits.append(rows["long"].refresh_split if "long" in rows else None)
        out = runner.run(cycle)
        carried = out.carried or [False] * len(out.blocks)
        blocks = [None if c else b for b, c in zip(out.blocks, carried)]
        generated.append({rid: b is not None for rid, b in zip(cycle.request_ids, blocks)})
        scheduler.update_from_output(cycle, blocks)
    assert splits == [(0, 2), (1, 2), (2, 2), (0, 2), (1, 2), (2, 2)]
    assert [g.get("long") for g in generated] == [False, False, True, False, False, True]
    assert [g.get("short") for g in generated] == [True, True, True, None, None, None]


def test_the_pieces_rule():
    splits = SplitRefreshes(chunk=512, layers=4)
    assert splits.pieces(1024) == 0  # within two chunks: whole (its pieces' cycles would cost more)
    assert splits.pieces(1025) == 3
    assert splits.pieces(3532) == 4  # 7 chunks, at most one piece per layer
    assert SplitRefreshes(chunk=0, layers=4).pieces(3532) == 0  # --prefill-chunk 0: never split
    assert SplitRefreshes(chunk=512, layers=0).pieces(3532) == 0  # a runner that cannot split
    assert splits.split_of("a", 3532) == (0, 4)
    for done in range(4):
        splits.ran("a", (done, 4), committed=False)
    assert splits.split_of("a", 3532) == (4, 4)
    splits.ran("a", (4, 4), committed=False)  # carried into the next cycle: still decoding
    assert splits.split_of("a", 3532) == (4, 4)
    splits.ran("a", (4, 4), committed=True)
    assert splits.split_of("a", 3564) == (0, 4)  # the next block's refresh splits afresh


def test_a_row_whose_refresh_is_in_reuses_at_its_first_forward():
    going_on = torch.tensor([True, True])
    forwards = torch.tensor([0, 0])
    waited, widths = torch.zeros(2, dtype=torch.long), torch.tensor([10, 20])
    plan = plan_phases(going_on, forwards, waited, widths, 0, None, ready=torch.tensor([False, True]))
    assert plan.refresh.tolist() == [True, False] and plan.reuse.tolist() == [False, True]
    later = plan_phases(
        going_on, torch.tensor([0, 2]), waited, widths, 2, None, ready=torch.tensor([False, True])
    )
    assert later.refresh.tolist() == [True, True]  # its interval's refreshes are its own


def test_dream_is_not_split():
    dream = load_model(str(REFERENCE_DIR / "dream"), dtype="float64")
    assert make_runner(dream, DECODING, BUDGET).refresh_layers == 0
