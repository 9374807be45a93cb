"""How a block-diffusion transformer (LLaDA2.0, SDAR: models/block_transformer.py) splits across a group.

Attention as for the Llama-style models (llama_shards.py), its fused q/k/v projection cut section by
section; the output projection ``dense`` row-parallel (a bias added on rank 0 only). A dense MLP is split
by width. With ``--tensor-parallel`` alone a mixture of experts is split inside: every expert (and the
shared experts) keeps ``width / N`` of its hidden units on each rank and the router is repeated.

Expert parallelism (``--expert-parallel E``): the routed experts are spread over E sets of ranks, each set
holding ``experts / E`` whole experts (split by width over the set's ``T / E`` ranks where the group also
has ``--tensor-parallel T``); the router is repeated, so every rank routes every token alike. The shared
experts, attention and dense layers stay as tensor parallelism leaves them: split over the ranks, or
repeated whole on each with ``--expert-parallel`` alone. Every rank already holds every token's hidden
state at the layer's input (the attention's all-reduce, or a repeated attention, made it whole), so a
token's dispatch to its experts' ranks moves no data: each rank runs its own experts over the (token, k)
pairs routed to them, and one all-reduce of the [tokens, hidden] output combines the ranks' parts, the
shared experts' split part with them (models/moe.py). An all-to-all dispatch and combine would send
``2 k tokens / N`` rows a rank (k experts a token) and then need an all-gather of every token's output for
the next layer's attention: more bytes than the all-reduce for every k here (LLaDA2.0's k is 8), and three
collectives for one. So a layer makes two all-reduces (attention, MLP) with tensor parallelism, with or
without expert parallelism, and one (the experts') with ``--expert-parallel`` alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from torch import nn

from engine_pod.models.block_transformer import BlockDiffusionTransformer
from engine_pod.models.config import ModelConfig, ModelConfigError
from engine_pod.models.moe import MixtureOfExperts
from engine_pod.parallel.cuts import Cut
from engine_pod.parallel.head_split import HeadSplit
from engine_pod.parallel.layers import VocabParallelEmbedding, VocabParallelHead

_ATTENTION = re.compile(r"layers\.\d+\.attention\.(query_key_value|dense)\.(weight|bias)")
_MLP = re.compile(
    r"layers\.\d+\.mlp\.(?:experts\.(\d+)\.|(shared_experts)\.)?(gate_proj|up_proj|down_proj)\.weight"
)


@dataclass(frozen=True)
class BlockShards(HeadSplit):
    """One rank's part of a block-diffusion model of ``config``."""

    def __post_init__(self) -> None:
        moe, parallel = self.config.moe, self.parallel
        if parallel.expert_sets > 1 and moe is None:
            raise ModelConfigError("--expert-parallel spreads a mixture of experts: this model has none")
        if moe and moe.num_experts % parallel.expert_sets:
            raise ModelConfigError(
                f"--expert-parallel {parallel.expert_sets} does not divide the model's {moe.num_experts} "
                "experts: each set of ranks must hold as many whole experts"
            )
        if moe and moe.expert_intermediate_size % parallel.expert_width_ranks:
            raise ModelConfigError(
                f"the experts' width {moe.expert_intermediate_size} does not split over "
                f"{parallel.expert_width_ranks} ranks (--tensor-parallel / --expert-parallel)"
            )
        shared = [moe.expert_intermediate_size * moe.shared_experts] if moe and moe.shared_experts else []
        self.check([self.config.intermediate_size, *shared])

    @property
    def experts_per_set(self) -> int:
        return self.config.moe.num_experts // self.parallel.expert_sets

    def rank_config(self) -> ModelConfig:
        config, parallel = self.config, self.parallel
        moe = config.moe
        if moe is not None:
            per_set = self.experts_per_set
            moe = replace(
                moe,
                expert_intermediate_size=moe.expert_intermediate_size // parallel.expert_width_ranks,
                held=(parallel.expert_set * per_set, per_set),
                shared_width=moe.expert_intermediate_size * moe.shared_experts // parallel.tensor_size,
            )
        return replace(
            config,
            num_heads=self.heads,
            num_kv_heads=self.kv_heads[1],
            intermediate_size=config.intermediate_size // parallel.tensor_size,
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
            if isinstance(layer.mlp, MixtureOfExperts):
                layer.mlp.combine = parallel.all_reduce  # its own all-reduce (models/moe.py)
                layer.mlp.shared_repeated = parallel.tensor_size == 1
            elif parallel.tensor_size > 1:
                layer.mlp.register_forward_hook(summed)
            if parallel.tensor_size > 1:
                layer.attention.dense.register_forward_hook(summed)
        if parallel.tensor_size > 1:
            rows, hidden = self.vocab_rows, config.hidden_size
            model.word_embeddings = VocabParallelEmbedding(
                rows, hidden, parallel.tensor_rank * rows, parallel
            )
            model.lm_head = VocabParallelHead(hidden, rows, config.vocab_size, parallel)
        return model

    def finish(self, model: nn.Module, random: bool = False) -> None:
        """Tied embeddings: the LM head is the embedding's rows (the same run of the vocabulary); the experts
        stacked for grouped matmuls."""
        if self.config.tied_embeddings:
            model.lm_head.weight = model.word_embeddings.weight
        model.fuse_projections()

    def cut(self, name: str, shape: tuple[int, ...]) -> Cut | None:
        """This rank's part of the whole model's parameter ``name`` of ``shape`` (None: another rank's
        expert)."""
        if name in ("word_embeddings.weight", "lm_head.weight"):
            return self.vocab_cut(shape)
        rank = self.parallel.tensor_rank
        attention = _ATTENTION.fullmatch(name)
        if attention is not None:
            projection, kind = attention.groups()
            if projection == "query_key_value":
                return self._qkv_rows(shape)
            if kind == "bias":  # added once, after the sum
                return Cut.whole(shape) if rank == 0 else Cut.zeros_of(shape)
            width = self.heads * self.config.head_dim
            return Cut.along(shape, 1, (rank * width, (rank + 1) * width))
        mlp = _MLP.fullmatch(name)
        if mlp is None:
            return Cut.whole(shape)  # norms, the router: repeated on every rank
        expert, _, projection = mlp.groups()
        dim = 1 if projection == "down_proj" else 0
        if expert is None:  # a dense MLP or the shared experts: split over the tensor ranks
            return self.split_cut(shape, dim)
        parallel = self.parallel
        if int(expert) // self.experts_per_set != parallel.expert_set:
            return None  # another set's expert
        return self.split_cut(shape, dim, parallel.expert_width_rank, parallel.expert_width_ranks)

    def _qkv_rows(self, shape: tuple[int, ...]) -> Cut:
        """The fused projection's rows of this rank's query heads, then its K and V heads'."""
        hd, heads, kv = self.config.head_dim, self.config.num_heads, self.config.num_kv_heads
        first, count = self.kv_heads
        q = self.parallel.tensor_rank * self.heads * hd
        k, v = heads * hd + first * hd, (heads + kv) * hd + first * hd
        return Cut.along(shape, 0, (q, q + self.heads * hd), (k, k + count * hd), (v, v + count * hd))
