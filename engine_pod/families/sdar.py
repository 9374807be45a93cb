"""SDAR (``model_type: sdar``, JetLM's SDAR-1.7B/4B/8B-Chat): block diffusion on Qwen3's dense
architecture (per-head q/k RMSNorm, full RoPE), decoded with an exact KV cache of committed blocks. A field
absent from config.json takes the default of its published configuration class (the table below), as the
reference loader does; a field the engine does not implement is refused by name."""

from __future__ import annotations

from typing import Any

from dllm_contracts.defaults import DEFAULT_BLOCK_LENGTH
from dllm_contracts.families import FamilyDecoding
from engine_pod.families.record import ModelFamily
from engine_pod.kinds.block_causal.kind import BLOCK_CAUSAL
from engine_pod.models.block_transformer import BlockDiffusionTransformer
from engine_pod.models.checkpoint_files import PART
from engine_pod.models.config import ModelConfig, as_tuple, mlp_activation
from engine_pod.models.config_fields import check_fixed, reader_with_defaults
from engine_pod.parallel.block_shards import BlockShards

NAME = "sdar"

# SDARConfig.__init__'s defaults: configuration_sdar.py of JetAstra/SDAR
# (training/model/SDAR-4B-Chat, commit c2041a8), the same class as published with JetLM's SDAR checkpoints.
SDAR_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,  # None: as many as the query heads
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "use_sliding_window": False,
    "pad_token_id": None,  # PretrainedConfig's
    # not in the class (its modelling reads config.mask_token_id): the SDAR tokenizer's ids
    "mask_token_id": 151669,  # <|MASK|>
    "eos_token_id": 151645,  # <|im_end|>: the end of a chat turn
}
SDAR_MASK_ID = SDAR_DEFAULTS["mask_token_id"]
SDAR_EOS_ID = SDAR_DEFAULTS["eos_token_id"]
_SDAR_FIXED = ("use_sliding_window", "rope_scaling")


def sdar_config(raw: dict[str, Any]) -> ModelConfig:
    """SDAR's config.json (the SDARConfig field set, Qwen3's names)."""
    get = reader_with_defaults(raw, SDAR_DEFAULTS)
    check_fixed("SDAR", get, SDAR_DEFAULTS, _SDAR_FIXED)
    heads = int(get("num_attention_heads"))
    bias = bool(get("attention_bias"))
    return ModelConfig(
        family=NAME,
        hidden_size=int(get("hidden_size")),
        num_layers=int(get("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(get("num_key_value_heads") or heads),
        intermediate_size=int(get("intermediate_size")),
        vocab_size=int(get("vocab_size")),
        rope_theta=float(get("rope_theta")),
        rms_norm_eps=float(get("rms_norm_eps")),
        qkv_bias=bias,
        mask_token_id=int(get("mask_token_id")),
        eos_token_ids=as_tuple(get("eos_token_id")) or (SDAR_EOS_ID,),
        pad_token_id=get("pad_token_id"),
        max_position_embeddings=int(get("max_position_embeddings")),
        head_dim_override=int(get("head_dim") or int(get("hidden_size")) // heads),
        qk_norm=True,
        output_bias=bias,
        tied_embeddings=bool(get("tie_word_embeddings")),
        activation=mlp_activation(get("hidden_act"), "hidden_act"),
        raw=raw,
    )


def _layer_names(config: ModelConfig, index: int) -> dict[str, str]:
    """SDAR's (Qwen3's) names of one layer -> ours; q, k and v are pieces of our fused projection."""
    theirs, ours = f"model.layers.{index}.", f"layers.{index}."
    names = {
        "input_layernorm.weight": "input_layernorm.weight",
        "post_attention_layernorm.weight": "post_attention_layernorm.weight",
        "self_attn.q_norm.weight": "attention.query_layernorm.weight",
        "self_attn.k_norm.weight": "attention.key_layernorm.weight",
        "self_attn.o_proj.weight": "attention.dense.weight",
        **{f"mlp.{p}_proj.weight": f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
    }
    kinds = ["weight"] + (["bias"] if config.qkv_bias else [])
    for kind in kinds:
        for piece, part in enumerate("qkv"):
            names[f"self_attn.{part}_proj.{kind}"] = f"attention.query_key_value.{kind}{PART}{piece}"
    if config.output_bias:
        names["self_attn.o_proj.bias"] = "attention.dense.bias"
    return {theirs + key: ours + value for key, value in names.items()}


def sdar_name_map(config: ModelConfig) -> dict[str, str]:
    """SDAR's checkpoint names -> ours, for every parameter."""
    mapping = {"model.embed_tokens.weight": "word_embeddings.weight", "model.norm.weight": "norm.weight"}
    if not config.tied_embeddings:
        mapping["lm_head.weight"] = "lm_head.weight"
    for index in range(config.num_layers):
        mapping |= _layer_names(config, index)
    return mapping


FAMILY = ModelFamily(
    name=NAME,
    display_name="SDAR",
    summary="SDAR, block diffusion with an exact KV cache",
    model_types=("sdar",),
    read_config=sdar_config,
    architecture=BlockDiffusionTransformer,
    kind=BLOCK_CAUSAL,
    checkpoints="JetLM/SDAR-1.7B/4B/8B-Chat",
    tiny_preset="sdar-tiny",
    decoding=FamilyDecoding(block_length=DEFAULT_BLOCK_LENGTH, steps_per_block=DEFAULT_BLOCK_LENGTH),
    name_map=sdar_name_map,
    tensor_parallel=BlockShards,
)
