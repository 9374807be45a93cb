"""How DiffusionGemma splits across a group (see parallel/llama_shards.py and block_shards.py for the others).

With ``--tensor-parallel N`` each rank holds ``heads / N`` query heads of every layer with their K/V heads
(a full-attention layer's single K/V head repeated on every rank), ``width / N`` of the dense MLP's hidden
units and of every expert's (the experts' stacked ``gate_up_proj`` cut in both halves), and
``ceil(vocab / N)`` rows of the tied embedding. The router, the norms, the self-conditioning MLP and the
layer scalars are repeated. Gemma's sandwich norms normalise each part's output before it joins the
stream, so each part is summed on its own: three all-reduces per layer (attention, dense MLP, experts), one
for the embedding; the canvas's logits are gathered along the vocabulary and the soft embeddings' product
summed (model.py).

With ``--expert-parallel E`` the routed experts are spread over E sets of ranks, each holding
``experts / E`` whole experts (split by width over the set's ``N / E`` ranks with ``--tensor-parallel N``);
every rank holds every token (parallel/block_shards.py says why no token moves), runs its experts over the
pairs routed to them, and the experts' all-reduce sums the ranks' parts. With ``--expert-parallel`` alone
attention, the dense MLP and the vocabulary are repeated whole on each rank: one all-reduce per layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.families.diffusion_gemma.experts import GemmaExperts
from engine_pod.families.diffusion_gemma.model import DiffusionGemmaModel
from engine_pod.models.config import ModelConfigError
from engine_pod.parallel.cuts import Cut
from engine_pod.parallel.head_split import HeadSplit
from engine_pod.parallel.layers import VocabParallelEmbedding

_LAYER = re.compile(r"(?:encoder_)?layers\.(\d+)\.(self_attn|mlp|experts)\.(\w+?)(?:\.weight)?")
_VOCAB = ("embed_tokens.weight", "encoder_embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class GemmaShards(HeadSplit):
    """One rank's part of a DiffusionGemma model of ``config`` (its K/V heads differ by layer)."""

    config: DiffusionGemmaConfig

    def __post_init__(self) -> None:
        config, parallel = self.config, self.parallel
        size = parallel.tensor_size
        kv_fit = all(kv % size == 0 or size % kv == 0 for kv in config.layer_kv_heads)
        if config.attention_bias and size > 1:
            raise ModelConfigError(
                "tensor parallelism of DiffusionGemma with attention biases is not supported"
            )
        if config.num_experts % parallel.expert_sets:
            raise ModelConfigError(
                f"--expert-parallel {parallel.expert_sets} does not divide the model's {config.num_experts} "
                "experts: each set of ranks must hold as many whole experts"
            )
        if config.moe_intermediate_size % parallel.expert_width_ranks:
            raise ModelConfigError(
                f"the experts' width {config.moe_intermediate_size} does not split over "
                f"{parallel.expert_width_ranks} ranks (--tensor-parallel / --expert-parallel)"
            )
        if config.num_heads % size or not kv_fit or config.intermediate_size % size:
            raise ModelConfigError(
                f"--tensor-parallel {size} does not divide the model: {config.num_heads} heads, K/V heads "
                f"{sorted(set(config.layer_kv_heads))} and MLP widths "
                f"{[config.intermediate_size, config.moe_intermediate_size]} must each split evenly (or "
                "the K/V heads divide the ranks)"
            )

    @property
    def experts_per_set(self) -> int:
        return self.config.num_experts // self.parallel.expert_sets

    def kv_heads_of(self, layer: int) -> tuple[int, int]:
        """(first, count) of this rank's K/V heads in ``layer``."""
        kv, size, rank = (
            self.config.layer_kv_heads[layer],
            self.parallel.tensor_size,
            self.parallel.tensor_rank,
        )
        return (rank * (kv // size), kv // size) if kv % size == 0 else (rank * kv // size, 1)

    def rank_config(self) -> DiffusionGemmaConfig:
        config, parallel = self.config, self.parallel
        return replace(
            config,
            num_heads=self.heads,
            layer_kv_heads=tuple(self.kv_heads_of(layer)[1] for layer in range(config.num_layers)),
            intermediate_size=config.intermediate_size // parallel.tensor_size,
            moe_intermediate_size=config.moe_intermediate_size // parallel.expert_width_ranks,
        )

    def build(
        self, architecture: Callable[[DiffusionGemmaConfig], DiffusionGemmaModel]
    ) -> DiffusionGemmaModel:
        """This rank's modules of ``architecture`` (the family's model class); call under the meta device."""
        config, parallel = self.config, self.parallel
        local = self.rank_config()
        model = architecture(local)
        first = parallel.expert_set * self.experts_per_set
        held = range(first, first + self.experts_per_set)
        model.self_conditioning = type(model.self_conditioning)(config)  # repeated whole
        summed = lambda module, inputs, output: parallel.all_reduce(output)  # noqa: E731
        split = parallel.tensor_size > 1
        for layers in (model.layers, getattr(model, "encoder_layers", [])):
            for layer in layers:
                layer.experts = GemmaExperts(local, held)  # this rank's set of experts
                layer.experts.register_forward_hook(summed)
                if split:
                    layer.self_attn.o_proj.register_forward_hook(summed)
                    layer.mlp.register_forward_hook(summed)
        if split:
            model.parallel = parallel  # the logits' gather and the soft embeddings' sum (model.py)
            rows, start = self.vocab_rows, parallel.tensor_rank * self.vocab_rows
            model.embed_tokens = VocabParallelEmbedding(rows, config.hidden_size, start, parallel)
            if not config.tie_word_embeddings:
                model.encoder_embed_tokens = VocabParallelEmbedding(rows, config.hidden_size, start, parallel)
                model.lm_head = torch.nn.Linear(config.hidden_size, rows, bias=False)
        return model

    def finish(self, model: DiffusionGemmaModel, random: bool = False) -> None:
        """The constant buffers no checkpoint holds (the unscaled norms' ones; a random model's layer
        scalars too)."""
        model.fill_constants(scalars=random)

    def cut(self, name: str, shape: tuple[int, ...]) -> Cut | None:
        """This rank's part of the whole model's parameter ``name`` of ``shape``."""
        if name in _VOCAB:
            return self.vocab_cut(shape)
        found = _LAYER.fullmatch(name)
        if found is None:
            return Cut.whole(shape)  # norms, router, self-conditioning, scalars: repeated
        layer, part, projection = int(found.group(1)), found.group(2), found.group(3)
        if part == "experts":
            return self._expert_cut(projection, shape)
        if part == "mlp":
            return self.split_cut(shape, 1 if projection == "down_proj" else 0)
        hd, rank = self.config.layer_head_dims[layer], self.parallel.tensor_rank
        heads = (rank * self.heads * hd, (rank + 1) * self.heads * hd)
        if projection == "q_proj":
            return Cut.along(shape, 0, heads)
        if projection in ("k_proj", "v_proj"):
            first, count = self.kv_heads_of(layer)
            return Cut.along(shape, 0, (first * hd, (first + count) * hd))
        if projection == "o_proj":
            return Cut.along(shape, 1, heads)
        return Cut.whole(shape)  # q_norm, k_norm: per head width, repeated

    def _expert_cut(self, projection: str, shape: tuple[int, ...]) -> Cut:
        """This rank's experts, each its width slice: ``gate_up_proj`` [E, 2W, D] (gate rows, then up),
        ``down_proj`` [E, D, W]."""
        parallel, per_set = self.parallel, self.experts_per_set
        rank, size = parallel.expert_width_rank, parallel.expert_width_ranks
        if projection == "down_proj":
            cut = self.split_cut(shape, 2, rank, size)
        else:
            part = shape[1] // 2 // size
            gate, up = (
                (rank * part, (rank + 1) * part),
                (shape[1] // 2 + rank * part, shape[1] // 2 + (rank + 1) * part),
            )
            cut = Cut.along(shape, 1, gate, up)
        first = parallel.expert_set * per_set
        return cut.narrowed(0, first, first + per_set)
