"""The op census of a block cycle that carries a prefill chunk (a long prompt's keys and values beside
decoding rows; DiffusionGemma's: a chunk of a long context in the cycle's encoder forward, beside the
decoding rows' canvases): no more syncs, copies or attention calls than the same cycle without it, and a
chunk's size never shows in the ops (the packed forward's ops do not grow with lengths)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dllm_contracts.request_params import RequestParams
from engine_pod.bench.census_run import _rows, decoding_for, prompt_lengths, reduce
from engine_pod.bench.op_census import counting
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput

BLOCK = 8  # the block-diffusion models' (DiffusionGemma's is its canvas)
CYCLES, LARGE = 3, 6  # cycles counted; the larger chunk, in blocks


@pytest.fixture(
    scope="module", params=["random:llada2-tiny", "random:sdar-tiny", "random:diffusion-gemma-tiny"]
)
def loaded(request):
    torch.set_num_threads(1)
    return load_model(request.param)


def _block(loaded) -> int:
    return getattr(loaded.config, "canvas_length", BLOCK)


def _figures(loaded, chunk: int):
    """Three cycles of 8 decoding rows, beside a long prompt's chunks of ``chunk`` tokens (0: none)."""
    block = _block(loaded)
    decoding = replace(decoding_for(loaded), block_length=block, steps_per_block=block)
    runner = make_runner(loaded, decoding, pool_tokens=1 << 15)
    rows = _rows(loaded, prompt_lengths(8, 8, 8), 0)
    params = RequestParams(max_tokens=512)
    size = (CYCLES * LARGE + 1) * block  # longer than every cycle's chunks
    long = CycleRow(tuple(range(10, 10 + size)), owner="long", params=params, prompt_len=size)
    censuses = []
    for cycle in range(CYCLES):
        chunk_row = [replace(long, prefill_to=chunk * (cycle + 1))] if chunk else []
        output = SchedulerOutput.of_rows(rows + chunk_row, gather_rows=True, packed=True)
        with counting(loaded.model) as census:
            ran = runner.run(output)
        censuses.append(census)
        assert not chunk or ran.blocks[-1] is None  # a chunk row commits nothing
        rows = [replace(row, prefix_ids=row.prefix_ids + tuple(b)) for row, b in zip(rows, ran.blocks)]
    runner.forget()
    return reduce(censuses)


def test_a_cycle_with_a_chunk_counts_within_the_bounds_of_one_without(loaded):
    block = _block(loaded)
    plain, small, large = (_figures(loaded, chunk) for chunk in (0, 2 * block, LARGE * block))
    for chunked in (small, large):
        assert chunked.syncs_per_forward <= plain.syncs_per_forward
        assert chunked.syncs_per_step <= plain.syncs_per_step
        assert chunked.syncs_per_cycle <= plain.syncs_per_cycle
        assert chunked.host_to_device_per_cycle <= plain.host_to_device_per_cycle
        assert chunked.attention_calls_per_layer == plain.attention_calls_per_layer
        assert chunked.forwards == plain.forwards
        assert chunked.moe_ops_per_call == plain.moe_ops_per_call
    assert large.first_forward_ops == small.first_forward_ops  # the chunk's size is no new op
