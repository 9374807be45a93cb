"""``--batch-invariant`` with ``--expert-parallel``: at expert-parallel 2 (alone and with tensor parallelism) a
request's float32 outputs, tokens and log probabilities to the bit, are the same alone and in any batch
(BlockServe packed and dense, static batches), and in float64 its tokens are one process's, alone and
batched. Real gloo processes."""

from __future__ import annotations

import pytest
import torch

from engine_pod.group_processes import ModelArgs, tensor_parallel_group
from engine_pod.loading.loader import load_model
from engine_pod.parallel.place import GroupPlace
from tests.engine_pod.test_batch_invariant import _outputs

SLOW = [("diffusion-gemma", 1, 2), ("llada2", 2, 2), ("diffusion-gemma", 2, 2)]
SIZES = [  # (family, --tensor-parallel, --expert-parallel); CI: one family, expert parallelism alone
    ("llada2", 1, 2),
    *(pytest.param(*size, marks=pytest.mark.slow) for size in SLOW),
]


def _group_outputs(family: str, tensor: int, expert: int, dtype: str) -> dict[str, dict]:
    with tensor_parallel_group(
        GroupPlace(tensor, expert=expert), ModelArgs(f"random:{family}-tiny", dtype=dtype)
    ) as loaded:
        return _outputs(loaded, family, on=True)


def _tokens(outputs: dict[str, tuple[list[int], list]]) -> dict[str, list[int]]:
    return {request_id: tokens for request_id, (tokens, _) in outputs.items()}


@pytest.mark.parametrize(("family", "tensor", "expert"), SIZES)
def test_at_expert_parallel_a_requests_float32_bits_are_the_same_alone_and_in_any_batch(
    family, tensor, expert
):
    torch.set_num_threads(1)
    outputs = _group_outputs(family, tensor, expert, "float32")
    alone = outputs.pop("alone")
    assert alone and all(tokens for tokens, _ in alone.values())
    for batching, got in outputs.items():
        assert got == alone, f"{family}, {batching}: {[rid for rid in alone if got[rid] != alone[rid]]}"


@pytest.mark.parametrize(("family", "tensor", "expert"), SIZES)
def test_at_expert_parallel_under_the_setting_a_requests_tokens_are_one_processes(family, tensor, expert):
    """Float64: each request's tokens alone and in every batch, those of one process alone."""
    torch.set_num_threads(1)
    one = _tokens(_outputs(load_model(f"random:{family}-tiny", dtype="float64"), family, on=True)["alone"])
    for batching, got in _group_outputs(family, tensor, expert, "float64").items():
        assert _tokens(got) == one, f"{family}, {batching}"
