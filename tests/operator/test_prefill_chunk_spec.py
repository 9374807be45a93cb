"""spec.scheduling.prefillChunk: the engine pods run `dllm worker --prefill-chunk` with it (every rank of a
tensor-parallel group too), nothing when it is absent (the worker's default from its budget), and the
operator refuses a chunk out of range with the field named."""

from __future__ import annotations

import pytest
from dllm_operator.spec import SpecError

from tests.operator.test_manifests import engine_worker_args, example


@pytest.mark.parametrize("chunk", [0, 256])
def test_the_prefill_chunk_reaches_dllm_worker(chunk):
    assert engine_worker_args(example(scheduling__prefillChunk=chunk)).prefill_chunk == chunk


def test_absent_the_worker_takes_its_own_default():
    assert engine_worker_args(example()).prefill_chunk is None


def test_a_tensor_parallel_group_chunks_too():
    args = engine_worker_args(example(scheduling__prefillChunk=512, parallelism__tensor=2))
    assert (args.prefill_chunk, args.tensor_parallel) == (512, 2)


def test_the_operator_refuses_a_negative_chunk():
    with pytest.raises(SpecError, match="scheduling.prefillChunk must be at least 0 tokens, got -1"):
        example(scheduling__prefillChunk=-1)
