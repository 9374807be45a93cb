"""dLLM-Serve's admission with a head-sparse cache (torch-free): a row holds its active block and the kept
share of its context, so at one token budget more rows are resident, as many as the kept share predicts."""

from __future__ import annotations

import pytest

from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.scheduler.dllm_serve import DllmServeScheduler

BLOCK = 8
PROMPT = 56  # every row: 56 prompt positions + one block of 8 = width 64, context 56


def _resident(kept_share: float, budget: int = 1024, cache_share: float = 0.5) -> int:
    config = SchedulerConfig(
        token_budget=budget, refresh_quota=0.25, batch_refresh_quota=0.25, cache_share=cache_share
    )
    scheduler = DllmServeScheduler(BLOCK, [], config, kept_share=kept_share, ignore_eos=True)
    for index in range(200):
        scheduler.add(scheduler.request_for(f"r{index}", list(range(1, PROMPT + 1)), BLOCK))
    return len(scheduler.schedule().request_ids)


@pytest.mark.parametrize("kept", [0.5, 0.3])
def test_a_sparse_row_costs_its_kept_share_so_more_rows_are_resident(kept):
    dense, sparse = _resident(1.0), _resident(kept)
    # budget in width units: (1024 - 0.5 * 256) / 0.5 = 1792; a row's reuse block at the forward's share: 8
    assert dense == 1792 // (64 + 8)
    assert sparse == 1792 // (BLOCK + round(kept * PROMPT) + 8)
    assert sparse > dense


def test_a_dense_kept_share_admits_as_before_and_a_bad_one_is_refused():
    assert _resident(1.0, cache_share=1.0) == 1024 // 64
    with pytest.raises(ValueError, match="kept share"):
        DllmServeScheduler(BLOCK, [], SchedulerConfig(token_budget=1024), kept_share=0.0)


def _claimable_prefix(kept_share: float) -> int:
    """The widest prefix a claim from the shared queue asks for beside 30 resident rows of width 64."""
    config = SchedulerConfig(token_budget=2048, refresh_quota=1.0, batch_refresh_quota=1.0, cache_share=1.0)
    scheduler = DllmServeScheduler(BLOCK, [], config, kept_share=kept_share, ignore_eos=True)
    for index in range(30):
        scheduler.add(scheduler.request_for(f"r{index}", list(range(1, PROMPT + 1)), BLOCK))
    assert len(scheduler.schedule().request_ids) == 30
    return scheduler.claim_plan().max_prefix


def test_a_claim_reaches_the_widest_prefix_a_sparse_row_may_hold():
    assert _claimable_prefix(1.0) == 2048 - 30 * 64 - BLOCK
    held = 30 * (BLOCK + PROMPT // 2)  # each resident row holds its block and half its context
    assert _claimable_prefix(0.5) == (2048 - held - BLOCK) * 2


def test_the_kept_share_of_each_cache():
    assert HeadSparseConfig().context_kept_share(6) == 1.0
    assert HeadSparseConfig(mode="uniform", retention=0.3).context_kept_share(6) == 0.3
    centric = HeadSparseConfig(mode="head-centric", retention=0.5, importance="heads.json")
    assert centric.group_sizes(6) == (1, 4, 1) and centric.group_sizes(32) == (6, 20, 6)
    assert centric.context_kept_share(6) == pytest.approx((1 + 4 * 0.5 + 0.2) / 6)
