"""LLaDA (``model_type: llada``, GSAI-ML's LLaDA-8B): a bidirectional Llama-style masked diffusion
model, decoded with Fast-dLLM's dual cache. Its config.json uses OLMo's field names."""

from __future__ import annotations

from typing import Any

from dllm_contracts.defaults import DEFAULT_BLOCK_LENGTH
from dllm_contracts.families import FamilyDecoding
from engine_pod.families.name_maps import layered_name_map
from engine_pod.families.record import DualCacheQuirks, ModelFamily
from engine_pod.kinds.bidirectional.kind import BIDIRECTIONAL
from engine_pod.models.config import ModelConfig, ModelConfigError, as_tuple, mlp_activation, require
from engine_pod.models.transformer import DiffusionTransformer
from engine_pod.parallel.llama_shards import LlamaShards

NAME = "llada"

_LAYER = {
    "attn_norm.weight": "attn_norm.weight",
    "ff_norm.weight": "mlp_norm.weight",
    "q_proj.weight": "attn.q_proj.weight",
    "k_proj.weight": "attn.k_proj.weight",
    "v_proj.weight": "attn.v_proj.weight",
    "q_proj.bias": "attn.q_proj.bias",
    "k_proj.bias": "attn.k_proj.bias",
    "v_proj.bias": "attn.v_proj.bias",
    "attn_out.weight": "attn.o_proj.weight",
    "ff_proj.weight": "mlp.gate_proj.weight",
    "up_proj.weight": "mlp.up_proj.weight",
    "ff_out.weight": "mlp.down_proj.weight",
}
_TOP_LEVEL = {
    "model.transformer.wte.weight": "embed_tokens.weight",
    "model.transformer.ln_f.weight": "norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}


def _check_supported(raw: dict[str, Any]) -> None:
    unsupported = {
        "alibi": (raw.get("alibi", False), False),
        "rope": (raw.get("rope", True), True),
        "block_type": (raw.get("block_type", "llama"), "llama"),
        "layer_norm_type": (raw.get("layer_norm_type", "rms"), "rms"),
        "weight_tying": (raw.get("weight_tying", False), False),
    }
    for key, (value, expected) in unsupported.items():
        if value != expected:
            raise ModelConfigError(
                f"LLaDA config field {key}={value!r} is not supported (expected {expected!r})"
            )


def llada_config(raw: dict[str, Any]) -> ModelConfig:
    """LLaDA's config.json (OLMo's field names; its activation_type names the MLP's gate activation, SiLU in
    every published LLaDA checkpoint and when absent)."""
    _check_supported(raw)
    d_model = int(require(raw, "d_model"))
    n_heads = int(require(raw, "n_heads"))
    n_kv = raw.get("n_kv_heads") or (1 if raw.get("multi_query_attention") else n_heads)
    mlp_hidden = raw.get("mlp_hidden_size") or int(raw.get("mlp_ratio", 4) * d_model)
    vocab = int(raw.get("embedding_size") or require(raw, "vocab_size"))
    return ModelConfig(
        family=NAME,
        hidden_size=d_model,
        num_layers=int(require(raw, "n_layers")),
        num_heads=n_heads,
        num_kv_heads=int(n_kv),
        intermediate_size=int(mlp_hidden),
        vocab_size=vocab,
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        qkv_bias=bool(raw.get("include_qkv_bias", False) or raw.get("include_bias", False)),
        mask_token_id=int(raw.get("mask_token_id", 126336)),
        eos_token_ids=as_tuple(raw.get("eos_token_id", 126081)),
        pad_token_id=raw.get("pad_token_id"),
        max_position_embeddings=int(raw.get("max_sequence_length", 4096)),
        activation=mlp_activation(raw.get("activation_type", "silu"), "activation_type"),
        raw=raw,
    )


def llada_name_map(config: ModelConfig) -> dict[str, str]:
    """LLaDA's checkpoint names -> ours, for every parameter."""
    return layered_name_map(config, _TOP_LEVEL, "model.transformer.blocks.{}.", _LAYER)


FAMILY = ModelFamily(
    name=NAME,
    display_name="LLaDA",
    summary="LLaDA, a bidirectional masked diffusion model",
    model_types=("llada",),
    read_config=llada_config,
    architecture=DiffusionTransformer,
    kind=BIDIRECTIONAL,
    checkpoints="GSAI-ML/LLaDA-8B-Instruct",
    tiny_preset="llada-tiny",
    decoding=FamilyDecoding(block_length=DEFAULT_BLOCK_LENGTH, steps_per_block=DEFAULT_BLOCK_LENGTH),
    name_map=llada_name_map,
    tensor_parallel=LlamaShards,
    # Fast-dLLM's LLaDA dual-cache sampler gives a block at most S forwards, even with threshold decoding
    quirks=DualCacheQuirks(caps_dual_cache_steps=True),
)
