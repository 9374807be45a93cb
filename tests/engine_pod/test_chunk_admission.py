"""Admission with chunked prefill, driven without a model (the scheduler is torch-free): a long prompt is
admitted at its full width, and only while no other prompt's chunks are running, so a cycle's first forward
carries at most one chunk beside the decoding rows; short prompts are admitted beside it all along."""

from __future__ import annotations

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.scheduler.blockserve import BlockServeScheduler

BLOCK, CHUNK, LONG = 32, 128, 1024


def _scheduler() -> BlockServeScheduler:
    config = SchedulerConfig(token_budget=8192, prefill_chunk=CHUNK, min_padding_efficiency=0)
    return BlockServeScheduler(BLOCK, [], config, grid_aligned=True, chunks_prefill=True, ignore_eos=True)


def _cycle_chunk_tokens(output) -> int:
    """Prompt tokens the cycle's chunk rows compute (each chunk row's chunk)."""
    return sum(CHUNK for row in output.rows if row.prefill_to)


def test_a_second_long_prompt_waits_for_the_first_ones_chunks_and_short_ones_do_not():
    scheduler = _scheduler()
    for name, length in (("long-a", LONG), ("long-b", LONG + BLOCK), ("short-0", 40), ("short-1", 50)):
        scheduler.add(scheduler.request_for(name, [7] * length, RequestParams(max_tokens=2 * BLOCK)))
    seen_running: list[set[str]] = []
    chunk_cycles = 0
    while scheduler.has_unfinished() and len(seen_running) < 200:
        output = scheduler.schedule()
        assert _cycle_chunk_tokens(output) <= CHUNK, "a cycle carries at most one chunk"
        chunk_cycles += bool(_cycle_chunk_tokens(output))
        seen_running.append(set(output.request_ids))
        blocks = [None if row.prefill_to else [1] * BLOCK for row in output.rows]
        scheduler.update_from_output(output, blocks)
    assert not scheduler.has_unfinished()
    first = seen_running[0]
    assert {"long-a", "short-0", "short-1"} <= first and "long-b" not in first
    # each long prompt's chunks, one prompt after the other: up to its first block less its last chunk
    assert chunk_cycles == (LONG - 1) // CHUNK + (LONG + BLOCK - 1) // CHUNK
    entered_b = next(i for i, running in enumerate(seen_running) if "long-b" in running)
    assert entered_b >= (LONG - 1) // CHUNK  # not before long-a's chunks were all computed


def test_without_chunking_two_long_prompts_enter_together():
    config = SchedulerConfig(token_budget=8192, prefill_chunk=0, min_padding_efficiency=0)
    scheduler = BlockServeScheduler(BLOCK, [], config, grid_aligned=True, chunks_prefill=True)
    for name in ("long-a", "long-b"):
        scheduler.add(scheduler.request_for(name, [7] * LONG, RequestParams(max_tokens=2 * BLOCK)))
    assert set(scheduler.schedule().request_ids) == {"long-a", "long-b"}


def test_a_long_prompt_waiting_for_anothers_chunks_does_not_hold_back_short_ones_even_when_aged():
    """The second long prompt waits for the first one's chunks however long it has waited (fairness
    reserves the budget, not the chunk lane); short prompts that arrive behind it are admitted meanwhile,
    and it enters as soon as the first one's chunks are in."""
    now = [0.0]
    config = SchedulerConfig(token_budget=8192, prefill_chunk=CHUNK, min_padding_efficiency=0, max_wait_s=0.5)
    scheduler = BlockServeScheduler(
        BLOCK, [], config, grid_aligned=True, chunks_prefill=True, ignore_eos=True, clock=lambda: now[0]
    )
    for name in ("long-a", "long-b"):
        scheduler.add(scheduler.request_for(name, [7] * LONG, RequestParams(max_tokens=2 * BLOCK)))
    chunk_cycles_a = (LONG - 1) // CHUNK
    entered: dict[str, int] = {}
    for cycle in range(60):
        now[0] = float(cycle)  # a second per cycle: long-b is aged from the second cycle on
        if cycle == 2:
            for i in range(3):
                scheduler.add(scheduler.request_for(f"short-{i}", [7] * 40, RequestParams(max_tokens=BLOCK)))
        output = scheduler.schedule()
        if output.is_empty:
            break
        for request_id in output.request_ids:
            entered.setdefault(request_id, cycle)
        blocks = [None if row.prefill_to else [1] * BLOCK for row in output.rows]
        scheduler.update_from_output(output, blocks)
    assert not scheduler.has_unfinished()
    assert all(entered[f"short-{i}"] == 2 for i in range(3)), entered  # not held behind long-b
    assert entered["long-b"] == chunk_cycles_a  # as soon as long-a's chunks are in
