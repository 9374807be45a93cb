"""How a Llama-style diffusion transformer (LLaDA, Dream: models/transformer.py) splits across a
tensor-parallel group.

Each rank holds ``heads / N`` query heads and their K/V heads (``kv_heads / N`` each where they divide,
else the one K/V head its query heads share, repeated on the ranks that share it), ``intermediate / N``
of the MLP's hidden units, and ``ceil(vocab / N)`` rows of the embedding and the LM head (the last rank's
run padded with zero rows); the norms are repeated. q/k/v and the MLP's gate/up are column-parallel (their
output rows split), o_proj and down_proj row-parallel (their input columns split, outputs summed by one
all-reduce each): two all-reduces per layer, one for the embedding, and the selected positions' logits
gathered once per LM-head chunk.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from engine_pod.models.config import ModelConfig, ModelConfigError
from engine_pod.models.transformer import DiffusionTransformer
from engine_pod.parallel.head_split import HeadSplit
from engine_pod.parallel.layers import RowParallelLinear, VocabParallelEmbedding, VocabParallelHead

_LAYER = re.compile(r"layers\.\d+\.(attn|mlp)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class LlamaShards(HeadSplit):
    """One rank's part of a Llama-style model of ``config``."""

    def __post_init__(self) -> None:
        if self.config.tied_embeddings:
            raise ModelConfigError("tensor parallelism of a model with tied embeddings is not supported")
        self.check([self.config.intermediate_size])

    def rank_config(self) -> ModelConfig:
        config = self.config
        return replace(
            config,
            num_heads=self.heads,
            num_kv_heads=self.kv_heads[1],
            intermediate_size=config.intermediate_size // self.parallel.size,
            head_dim_override=config.head_dim,
        )

    def build(self, architecture: Callable[[ModelConfig], DiffusionTransformer]) -> DiffusionTransformer:
        """This rank's modules of ``architecture`` (the family's model class: a DiffusionTransformer's
        layers, however they are wired); call under the meta device: the caller allocates and loads them."""
        config, parallel = self.config, self.parallel
        local = self.rank_config()
        model = architecture(local)
        hidden, rows = config.hidden_size, self.vocab_rows
        for layer in model.layers:
            layer.attn.o_proj = RowParallelLinear(local.num_heads * local.head_dim, hidden, parallel)
            layer.mlp.down_proj = RowParallelLinear(local.intermediate_size, hidden, parallel)
        model.embed_tokens = VocabParallelEmbedding(rows, hidden, parallel.rank * rows, parallel)
        model.lm_head = VocabParallelHead(hidden, rows, config.vocab_size, parallel)
        return model  # its config is this rank's: its KV pool holds this rank's K/V heads

    def finish(self, model) -> None:
        """The inference layout: q, k and v fused (tied embeddings are refused)."""
        model.fuse_projections()

    def shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the whole model's parameter ``name`` (a copy: the whole is not kept)."""
        if name in ("embed_tokens.weight", "lm_head.weight"):
            return self.vocab_slice(tensor)
        found = _LAYER.fullmatch(name)
        if found is None:
            return tensor  # norms: repeated on every rank
        _, projection, _ = found.groups()
        hd, rank, size = self.config.head_dim, self.parallel.rank, self.parallel.size
        if projection == "q_proj":
            return tensor[rank * self.heads * hd :][: self.heads * hd].clone()
        if projection in ("k_proj", "v_proj"):
            first, count = self.kv_heads
            return tensor[first * hd : (first + count) * hd].clone()
        if projection == "o_proj":
            return tensor[:, rank * self.heads * hd :][:, : self.heads * hd].clone()
        width = self.config.intermediate_size // size
        if projection in ("gate_proj", "up_proj"):
            return tensor[rank * width : (rank + 1) * width].clone()
        if projection == "down_proj":
            return tensor[:, rank * width : (rank + 1) * width].clone()
        raise ModelConfigError(f"no tensor-parallel split is known for parameter {name!r}")
