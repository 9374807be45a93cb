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

from engine_pod.models.config import ModelConfig, ModelConfigError
from engine_pod.models.transformer import DiffusionTransformer
from engine_pod.parallel.cuts import Cut
from engine_pod.parallel.head_split import HeadSplit
from engine_pod.parallel.layers import RowParallelLinear, VocabParallelEmbedding, VocabParallelHead

_LAYER = re.compile(r"layers\.\d+\.(attn|mlp)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class LlamaShards(HeadSplit):
    """One rank's part of a Llama-style model of ``config``."""

    def __post_init__(self) -> None:
        if self.config.tied_embeddings:
            raise ModelConfigError("tensor parallelism of a model with tied embeddings is not supported")
        if self.parallel.expert_sets > 1:
            raise ModelConfigError("--expert-parallel spreads a mixture of experts: this model has none")
        self.check([self.config.intermediate_size])

    def rank_config(self) -> ModelConfig:
        config = self.config
        return replace(
            config,
            num_heads=self.heads,
            num_kv_heads=self.kv_heads[1],
            intermediate_size=config.intermediate_size // self.parallel.tensor_size,
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
        model.embed_tokens = VocabParallelEmbedding(rows, hidden, parallel.tensor_rank * rows, parallel)
        model.lm_head = VocabParallelHead(hidden, rows, config.vocab_size, parallel)
        return model  # its config is this rank's: its KV pool holds this rank's K/V heads

    def finish(self, model, random: bool = False) -> None:
        """The inference layout: q, k and v fused (tied embeddings are refused)."""
        model.fuse_projections()

    def cut(self, name: str, shape: tuple[int, ...]) -> Cut:
        """This rank's part of the whole model's parameter ``name`` of ``shape``."""
        if name in ("embed_tokens.weight", "lm_head.weight"):
            return self.vocab_cut(shape)
        found = _LAYER.fullmatch(name)
        if found is None:
            return Cut.whole(shape)  # norms: repeated on every rank
        _, projection, _ = found.groups()
        hd, rank = self.config.head_dim, self.parallel.tensor_rank
        heads = (rank * self.heads * hd, (rank + 1) * self.heads * hd)
        if projection == "q_proj":
            return Cut.along(shape, 0, heads)
        if projection in ("k_proj", "v_proj"):
            first, count = self.kv_heads
            return Cut.along(shape, 0, (first * hd, (first + count) * hd))
        if projection == "o_proj":
            return Cut.along(shape, 1, heads)
        if projection in ("gate_proj", "up_proj"):
            return self.split_cut(shape, 0)
        if projection == "down_proj":
            return self.split_cut(shape, 1)
        raise ModelConfigError(f"no tensor-parallel split is known for parameter {name!r}")
