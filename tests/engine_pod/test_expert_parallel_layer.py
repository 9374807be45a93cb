"""An expert-parallel rank's part of the model and of each forward: it holds 1/N of the experts (each expert
whole, or its width share with tensor parallelism) and the rest as tensor parallelism leaves it; each
mixture-of-experts layer makes one all-reduce (real gloo processes); and a rank's expert layer runs the
same operations on the same shapes, with nothing read back to the host, whatever experts the tokens chose
(all on this rank's, none, or some)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine_pod.decoding.config import DecodingConfig
from engine_pod.generation import generate_one
from engine_pod.group_processes import ModelArgs, tensor_parallel_group
from engine_pod.loading.loader import load_model
from engine_pod.loading.sharded import load_shard
from engine_pod.parallel.group import TensorParallel
from engine_pod.parallel.layout import GroupLayout
from engine_pod.parallel.place import GroupPlace

LLADA2, GEMMA = "random:llada2-tiny", "random:diffusion-gemma-tiny"
PROMPT = [5, 17, 33, 8, 101, 64, 12]
SIZES = [(1, 2), (1, 4), (2, 2), (4, 2), (4, 4)]  # (--tensor-parallel, --expert-parallel)


def _is_expert(name: str) -> bool:
    return ".mlp.experts." in name or ".experts.gate_up_proj" in name or ".experts.down_proj" in name


def _rank(model: str, rank: int, tensor: int, expert: int, dtype: str = "float64"):
    layout = GroupLayout(tensor, expert)
    return load_shard(model, TensorParallel(rank, layout.ranks, layout=layout), dtype=dtype)


@pytest.mark.parametrize("model", [LLADA2, GEMMA])
@pytest.mark.parametrize(("tensor", "expert"), SIZES)
def test_each_rank_holds_its_share_of_the_experts_and_the_rest_as_tensor_parallelism_leaves_it(
    model, tensor, expert
):
    """Experts: exactly 1/N of the whole's (N ranks: E sets of whole experts, each split over T / E).
    With expert parallelism alone, every other parameter whole; with tensor parallelism, no more than it
    held without expert parallelism."""
    whole = dict(load_model(model, dtype="float64").model.named_parameters())
    experts = sum(p.numel() for name, p in whole.items() if _is_expert(name))
    rest = sum(p.numel() for name, p in whole.items() if not _is_expert(name))
    ranks = max(tensor, expert)
    for rank in range(ranks):
        held = dict(_rank(model, rank, tensor, expert).model.named_parameters())
        held_experts = sum(p.numel() for name, p in held.items() if _is_expert(name))
        held_rest = sum(p.numel() for name, p in held.items() if not _is_expert(name))
        assert held_experts * ranks == experts, (rank, held_experts, experts)
        if tensor == 1:
            assert held_rest == rest  # attention, dense layers, router, shared experts: repeated
        else:
            split = dict(_rank(model, rank, tensor, 1).model.named_parameters())
            assert held_rest == sum(p.numel() for name, p in split.items() if not _is_expert(name))


def _moe_layers(loaded) -> int:
    config = loaded.config
    moe = getattr(config, "moe", None)
    return config.num_layers - (moe.first_dense_layers if moe else 0)


def test_expert_parallel_alone_makes_one_all_reduce_per_mixture_of_experts_layer():
    """LLaDA2.0 at --expert-parallel 2: attention, dense layers and the vocabulary are repeated, so a
    forward's only collectives are its expert layers' all-reduces (its first layer is dense), one each;
    each carries the layer's [tokens, hidden] output."""
    torch.set_num_threads(1)
    decoding = DecodingConfig(block_length=8, steps_per_block=4)
    with tensor_parallel_group(GroupPlace(1, expert=2), ModelArgs(LLADA2, dtype="float64")) as loaded:
        loaded.parallel.clear_counts()
        result = generate_one(loaded, PROMPT, 16, decoding)
        made, sent = dict(loaded.parallel.counts), dict(loaded.parallel.sent)
        layers, hidden = _moe_layers(loaded), loaded.config.hidden_size
    assert set(made) == {"all_reduce", "broadcast"}  # no gather: the LM head is whole on each rank
    assert made["all_reduce"] == result.num_forward_passes * layers
    assert sent["all_reduce"] % (layers * hidden * 8) == 0  # whole [tokens, hidden] float64 outputs


def test_with_tensor_parallelism_a_layer_makes_its_two_all_reduces_as_before():
    """--tensor-parallel 2 --expert-parallel 2: attention's and the MLP's all-reduce per layer (the
    experts' parts summed with the shared experts' split), one for the embedding, the logits gathered."""
    torch.set_num_threads(1)
    decoding = DecodingConfig(block_length=8, steps_per_block=4)
    with tensor_parallel_group(GroupPlace(2, expert=2), ModelArgs(LLADA2, dtype="float64")) as loaded:
        loaded.parallel.clear_counts()
        result = generate_one(loaded, PROMPT, 16, decoding)
        made, layers = dict(loaded.parallel.counts), loaded.config.num_layers
    forwards = result.num_forward_passes
    assert made["all_reduce"] == forwards * (2 * layers + 1)
    assert made["all_gather"] >= forwards


class _Ops(TorchDispatchMode):
    """Every operation dispatched, with its outputs' shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = tuple(
            tuple(t.shape)
            for t in (out if isinstance(out, (tuple, list)) else [out])
            if isinstance(t, torch.Tensor)
        )
        self.ops.append((str(func), shapes))
        return out


def _routings(experts: int, per_set: int, held: range, tokens: int, k: int) -> list[torch.Tensor]:
    """Each token's k experts: all on this rank's set, all on another set's, and a mix."""
    others = [e for e in range(experts) if e not in held]
    mine = torch.tensor([[held[(t + j) % len(held)] for j in range(k)] for t in range(tokens)])
    theirs = torch.tensor([[others[(t + j) % len(others)] for j in range(k)] for t in range(tokens)])
    mixed = torch.stack(
        [torch.randperm(experts, generator=torch.Generator().manual_seed(t))[:k] for t in range(tokens)]
    )
    return [mine, theirs, mixed]


def _routed_ops(model: str, rank: int, tensor: int, expert: int) -> list[list[tuple[str, tuple]]]:
    """The operations of rank ``rank``'s first expert layer over 40 tokens, for each routing (float32: the
    grouped matmuls)."""
    loaded = _rank(model, rank, tensor, expert, dtype="float32")
    layer = loaded.model.layers[-1]
    module = layer.mlp if model == LLADA2 else layer.experts
    x = torch.randn(40, loaded.config.hidden_size, generator=torch.Generator().manual_seed(0))
    experts = loaded.config.moe.num_experts if model == LLADA2 else loaded.config.num_experts
    k = loaded.config.moe.experts_per_token if model == LLADA2 else loaded.config.top_k_experts
    held = module.held
    recorded = []
    for chosen in _routings(experts, len(held), held, 40, k):
        weights = torch.rand(chosen.shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad(), _Ops() as ops:
            if model == LLADA2:
                module._routed(x, chosen, weights)
            else:
                module.forward(x, chosen, weights)  # the rank's part, before its layer's all-reduce
        recorded.append(ops.ops)
    return recorded


@pytest.mark.parametrize("model", [LLADA2, GEMMA])
@pytest.mark.parametrize(("tensor", "expert"), [(1, 2), (4, 2)])
def test_a_ranks_expert_layer_runs_the_same_operations_whatever_experts_were_chosen(model, tensor, expert):
    for rank in range(max(tensor, expert)):
        mine, theirs, mixed = _routed_ops(model, rank, tensor, expert)
        assert mine == theirs == mixed, rank
        names = {name for name, _ in mine}
        assert "aten._grouped_mm.default" in names  # the grouped path (float32), not a loop over experts
        assert not names & {"aten._local_scalar_dense.default", "aten.item.default", "aten.nonzero.default"}
