"""Chunked prefill on a tensor-parallel group (gloo, real processes): rank 0's scheduler cuts long prompts
into chunks as one process does, every rank computes them, and every request's tokens are those of one
process computing each prompt whole."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch

from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.group_processes import ModelArgs, tensor_parallel_group
from engine_pod.loading.loader import load_model
from engine_pod.parallel.place import GroupPlace
from engine_pod.scheduler.blockserve import BlockServeScheduler
from tests.engine_utils import _engine_with

BLOCK, CHUNK = 8, 32
DECODING = DecodingConfig(block_length=BLOCK, steps_per_block=8, threshold=0.6, remasking="threshold")


def _workload() -> list[tuple[str, list[int], int]]:
    rng = random.Random(5)
    lengths = [150, 12, 9, 97, 20]  # two prompts of several chunks among short ones
    return [(f"r{i}", [rng.randrange(1, 1000) for _ in range(n)], 2 * BLOCK) for i, n in enumerate(lengths)]


def _run(loaded, chunk: int) -> tuple[dict[str, list[int]], int]:
    """Each request's tokens, and the prefill chunks the cycles computed."""
    config = SchedulerConfig(token_budget=1024, prefill_chunk=chunk)
    scheduler = partial(BlockServeScheduler, BLOCK, [], config, ignore_eos=True)
    engine = _engine_with(loaded, scheduler, DECODING, _workload(), None)
    outputs: dict[str, list[int]] = {}
    engine.run(lambda r: outputs.__setitem__(r.request_id, list(r.generated)))
    return outputs, sum(record.prefill_chunks for record in engine.records)


@pytest.mark.parametrize(
    "model", ["random:llada2-tiny", pytest.param("random:sdar-tiny", marks=pytest.mark.slow)]
)
def test_two_ranks_chunk_long_prompts_and_give_the_tokens_of_one_unchunked_process(model):
    torch.set_num_threads(1)
    whole, none = _run(load_model(model, dtype="float64"), 0)
    assert none == 0
    with tensor_parallel_group(GroupPlace(2), ModelArgs(model, dtype="float64")) as loaded:
        chunked, chunks = _run(loaded, CHUNK)
    # the 150- and 97-token prompts up to their first blocks (144, 96), less each one's last chunk
    assert chunks == (144 - 1) // CHUNK + (96 - 1) // CHUNK
    assert chunked == whole
