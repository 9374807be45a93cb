"""Dream (``model_type: Dream``, Dream-org's Dream-v0-7B): a bidirectional Qwen2-style masked diffusion
model, decoded with Fast-dLLM's dual cache. It predicts the token at position p from the hidden state at
p - 1, and its block sampler commits each block's first position from the refresh forward."""

from __future__ import annotations

from typing import Any

from dllm_contracts.defaults import DEFAULT_BLOCK_LENGTH
from dllm_contracts.families import FamilyDecoding
from engine_pod.families.name_maps import layered_name_map
from engine_pod.families.record import DualCacheQuirks, ModelFamily
from engine_pod.kinds.bidirectional.kind import BIDIRECTIONAL
from engine_pod.models.config import ModelConfig, as_tuple, mlp_activation, qwen_shape
from engine_pod.models.transformer import DiffusionTransformer
from engine_pod.parallel.llama_shards import LlamaShards

NAME = "dream"

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "mlp_norm.weight",
    "self_attn.q_proj.weight": "attn.q_proj.weight",
    "self_attn.k_proj.weight": "attn.k_proj.weight",
    "self_attn.v_proj.weight": "attn.v_proj.weight",
    "self_attn.q_proj.bias": "attn.q_proj.bias",
    "self_attn.k_proj.bias": "attn.k_proj.bias",
    "self_attn.v_proj.bias": "attn.v_proj.bias",
    "self_attn.o_proj.weight": "attn.o_proj.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
_TOP_LEVEL = {
    "model.embed_tokens.weight": "embed_tokens.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


def dream_config(raw: dict[str, Any]) -> ModelConfig:
    """Dream's config.json (Qwen2's field names; an absent hidden_act is DreamConfig's default, SiLU)."""
    return ModelConfig(
        family=NAME,
        **qwen_shape(raw),
        qkv_bias=True,
        mask_token_id=int(raw.get("mask_token_id", 151666)),
        eos_token_ids=as_tuple(raw.get("eos_token_id", 151643)),
        pad_token_id=raw.get("pad_token_id"),
        max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
        activation=mlp_activation(raw.get("hidden_act", "silu"), "hidden_act"),
        raw=raw,
    )


def dream_name_map(config: ModelConfig) -> dict[str, str]:
    """Dream's (Qwen2's) checkpoint names -> ours, for every parameter."""
    return layered_name_map(config, _TOP_LEVEL, "model.layers.{}.", _LAYER)


FAMILY = ModelFamily(
    name=NAME,
    display_name="Dream",
    summary="Dream, a bidirectional masked diffusion model",
    model_types=("dream",),
    read_config=dream_config,
    architecture=DiffusionTransformer,
    kind=BIDIRECTIONAL,
    checkpoints="Dream-org/Dream-v0-Instruct-7B",
    tiny_preset="dream-tiny",
    decoding=FamilyDecoding(block_length=DEFAULT_BLOCK_LENGTH, steps_per_block=DEFAULT_BLOCK_LENGTH),
    name_map=dream_name_map,
    tensor_parallel=LlamaShards,
    quirks=DualCacheQuirks(logit_shift=1, commits_block_start_on_refresh=True),
)
