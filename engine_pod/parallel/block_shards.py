"""How a block-diffusion transformer (LLaDA2.0, SDAR: models/block_transformer.py) splits across a
tensor-parallel group.

Attention as for the Llama-style models (llama_shards.py), its fused q/k/v projection cut section by
section; the output projection ``dense`` row-parallel (a bias added on rank 0 only). The MLP, dense or a
mixture of experts, is split inside: every expert (and the shared experts) keeps ``width / N`` of its
hidden units on each rank, the router is repeated, and the layer's output is summed by one all-reduce.
Tensor parallelism inside the experts rather than experts spread over ranks: every rank routes every
token alike and runs the same operations whatever experts the tokens choose (no all-to-all exchange of
tokens, no rank idle while another's experts are busy), at the cost of narrower matmuls per expert; two
all-reduces per layer either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from engine_pod.models.block_transformer import BlockDiffusionTransformer
from engine_pod.models.config import ModelConfig
from engine_pod.parallel.head_split import HeadSplit
from engine_pod.parallel.layers import VocabParallelEmbedding, VocabParallelHead

_ATTENTION = re.compile(r"layers\.\d+\.attention\.(query_key_value|dense)\.(weight|bias)")
_MLP = re.compile(
    r"layers\.\d+\.mlp\.(?:experts\.\d+\.|shared_experts\.)?(gate_proj|up_proj|down_proj)\.weight"
)


@dataclass(frozen=True)
class BlockShards(HeadSplit):
    """One rank's part of a block-diffusion model of ``config``."""

    def __post_init__(self) -> None:
        moe = self.config.moe
        self.check([self.config.intermediate_size] + ([moe.expert_intermediate_size] if moe else []))

    def rank_config(self) -> ModelConfig:
        config, size = self.config, self.parallel.size
        moe = config.moe and replace(
            config.moe, expert_intermediate_size=config.moe.expert_intermediate_size // size
        )
        return replace(
            config,
            num_heads=self.heads,
            num_kv_heads=self.kv_heads[1],
            intermediate_size=config.intermediate_size // size,
            moe=moe,
            head_dim_override=config.head_dim,
        )

    def build(
        self, architecture: Callable[[ModelConfig], BlockDiffusionTransformer]
    ) -> BlockDiffusionTransformer:
        """This rank's modules of ``architecture`` (the family's model class); call under the meta device."""
        config, parallel = self.config, self.parallel
        model = architecture(self.rank_config())
        summed = lambda module, inputs, output: parallel.all_reduce(output)  # noqa: E731
        for layer in model.layers:
            layer.attention.dense.register_forward_hook(summed)
            layer.mlp.register_forward_hook(summed)
        rows, hidden = self.vocab_rows, config.hidden_size
        model.word_embeddings = VocabParallelEmbedding(rows, hidden, parallel.rank * rows, parallel)
        model.lm_head = VocabParallelHead(hidden, rows, config.vocab_size, parallel)
        return model

    def finish(self, model: nn.Module) -> None:
        """Tied embeddings: the LM head is the embedding's rows (the same run of the vocabulary); the experts
        stacked for grouped matmuls."""
        if self.config.tied_embeddings:
            model.lm_head.weight = model.word_embeddings.weight
        model.fuse_projections()

    def shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the whole model's parameter ``name`` (a copy)."""
        if name in ("word_embeddings.weight", "lm_head.weight"):
            return self.vocab_slice(tensor)
        rank, size = self.parallel.rank, self.parallel.size
        attention = _ATTENTION.fullmatch(name)
        if attention is not None:
            projection, kind = attention.groups()
            if projection == "query_key_value":
                return self._qkv_rows(tensor)
            if kind == "bias":  # added once, after the sum
                return tensor.clone() if rank == 0 else torch.zeros_like(tensor)
            width = self.heads * self.config.head_dim
            return tensor[:, rank * width : (rank + 1) * width].clone()
        mlp = _MLP.fullmatch(name)
        if mlp is None:
            return tensor  # norms, the router: repeated on every rank
        if mlp.group(1) == "down_proj":
            width = tensor.shape[1] // size
            return tensor[:, rank * width : (rank + 1) * width].clone()
        width = tensor.shape[0] // size
        return tensor[rank * width : (rank + 1) * width].clone()

    def _qkv_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """The fused projection's rows of this rank's query heads, then its K and V heads'."""
        hd, heads, kv = self.config.head_dim, self.config.num_heads, self.config.num_kv_heads
        first, count = self.kv_heads
        q = tensor[self.parallel.rank * self.heads * hd :][: self.heads * hd]
        k = tensor[heads * hd + first * hd :][: count * hd]
        v = tensor[(heads + kv) * hd + first * hd :][: count * hd]
        return torch.cat([q, k, v])
