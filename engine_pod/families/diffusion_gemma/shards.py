"""How DiffusionGemma splits across a tensor-parallel group (see parallel/llama_shards.py for the others).

Each rank holds ``heads / N`` query heads of every layer with their K/V heads (a full-attention layer's
single K/V head repeated on every rank), ``width / N`` of the dense MLP's hidden units and of every expert's
(the experts' stacked ``gate_up_proj`` cut in both halves), and ``ceil(vocab / N)`` rows of the tied
embedding. The router, the norms, the self-conditioning MLP and the layer scalars are repeated. Gemma's
sandwich norms normalise each part's output before it joins the stream, so each part is summed on its own:
three all-reduces per layer (attention, dense MLP, experts), one for the embedding; the canvas's logits
are gathered along the vocabulary and the soft embeddings' product summed (model.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.families.diffusion_gemma.model import DiffusionGemmaModel
from engine_pod.models.config import ModelConfigError
from engine_pod.parallel.head_split import HeadSplit
from engine_pod.parallel.layers import VocabParallelEmbedding

_LAYER = re.compile(r"(?:encoder_)?layers\.(\d+)\.(self_attn|mlp|experts)\.(\w+?)(?:\.weight)?")
_VOCAB = ("embed_tokens.weight", "encoder_embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class GemmaShards(HeadSplit):
    """One rank's part of a DiffusionGemma model of ``config`` (its K/V heads differ by layer)."""

    config: DiffusionGemmaConfig

    def __post_init__(self) -> None:
        config, size = self.config, self.parallel.size
        widths = [config.intermediate_size, config.moe_intermediate_size]
        kv_fit = all(kv % size == 0 or size % kv == 0 for kv in config.layer_kv_heads)
        if config.attention_bias:
            raise ModelConfigError(
                "tensor parallelism of DiffusionGemma with attention biases is not supported"
            )
        if config.num_heads % size or not kv_fit or any(w % size for w in widths):
            raise ModelConfigError(
                f"--tensor-parallel {size} does not divide the model: {config.num_heads} heads, K/V heads "
                f"{sorted(set(config.layer_kv_heads))} and MLP widths {widths} must each split evenly (or "
                "the K/V heads divide the ranks)"
            )

    def kv_heads_of(self, layer: int) -> tuple[int, int]:
        """(first, count) of this rank's K/V heads in ``layer``."""
        kv, size, rank = self.config.layer_kv_heads[layer], self.parallel.size, self.parallel.rank
        return (rank * (kv // size), kv // size) if kv % size == 0 else (rank * kv // size, 1)

    def rank_config(self) -> DiffusionGemmaConfig:
        config, size = self.config, self.parallel.size
        return replace(
            config,
            num_heads=self.heads,
            layer_kv_heads=tuple(self.kv_heads_of(layer)[1] for layer in range(config.num_layers)),
            intermediate_size=config.intermediate_size // size,
            moe_intermediate_size=config.moe_intermediate_size // size,
        )

    def build(
        self, architecture: Callable[[DiffusionGemmaConfig], DiffusionGemmaModel]
    ) -> DiffusionGemmaModel:
        """This rank's modules of ``architecture`` (the family's model class); call under the meta device."""
        config, parallel = self.config, self.parallel
        model = architecture(self.rank_config())
        model.parallel = parallel
        model.self_conditioning = type(model.self_conditioning)(config)  # repeated whole
        summed = lambda module, inputs, output: parallel.all_reduce(output)  # noqa: E731
        for layers in (model.layers, getattr(model, "encoder_layers", [])):
            for layer in layers:
                layer.self_attn.o_proj.register_forward_hook(summed)
                layer.mlp.register_forward_hook(summed)
                layer.experts.register_forward_hook(summed)
        rows, start = self.vocab_rows, parallel.rank * self.vocab_rows
        model.embed_tokens = VocabParallelEmbedding(rows, config.hidden_size, start, parallel)
        if not config.tie_word_embeddings:
            model.encoder_embed_tokens = VocabParallelEmbedding(rows, config.hidden_size, start, parallel)
            model.lm_head = torch.nn.Linear(config.hidden_size, rows, bias=False)
        return model

    def finish(self, model: DiffusionGemmaModel) -> None:
        """The constant buffers no checkpoint holds (the unscaled norms' ones)."""
        model.fill_constants()

    def shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the whole model's parameter ``name`` (a copy)."""
        if name in _VOCAB:
            return self.vocab_slice(tensor)
        found = _LAYER.fullmatch(name)
        if found is None:
            return tensor  # norms, router, self-conditioning, scalars: repeated
        layer, part, projection = int(found.group(1)), found.group(2), found.group(3)
        rank, size = self.parallel.rank, self.parallel.size
        if part == "experts":
            return self._expert_slice(projection, tensor)
        if part == "mlp":
            if projection == "down_proj":
                width = tensor.shape[1] // size
                return tensor[:, rank * width : (rank + 1) * width].clone()
            width = tensor.shape[0] // size
            return tensor[rank * width : (rank + 1) * width].clone()
        hd = self.config.layer_head_dims[layer]
        if projection == "q_proj":
            return tensor[rank * self.heads * hd :][: self.heads * hd].clone()
        if projection in ("k_proj", "v_proj"):
            first, count = self.kv_heads_of(layer)
            return tensor[first * hd : (first + count) * hd].clone()
        if projection == "o_proj":
            return tensor[:, rank * self.heads * hd :][:, : self.heads * hd].clone()
        return tensor  # q_norm, k_norm: per head width, repeated

    def _expert_slice(self, projection: str, tensor: torch.Tensor) -> torch.Tensor:
        """Every expert's slice: ``gate_up_proj`` [E, 2W, D] (gate rows, then up), ``down_proj`` [E, D, W]."""
        rank, size = self.parallel.rank, self.parallel.size
        if projection == "down_proj":
            width = tensor.shape[2] // size
            return tensor[:, :, rank * width : (rank + 1) * width].clone()
        width = tensor.shape[1] // 2
        part = width // size
        gate = tensor[:, rank * part : (rank + 1) * part]
        up = tensor[:, width + rank * part : width + (rank + 1) * part]
        return torch.cat([gate, up], 1)
