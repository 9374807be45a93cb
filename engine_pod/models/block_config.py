"""config.json of the block-diffusion families, read into a ModelConfig.

LLaDA2.0 (``model_type: llada2_moe``, inclusionAI's LLaDA2.0-mini and -flash): Ling's MoE
architecture. SDAR (``model_type: sdar``, JetLM's SDAR-1.7B/4B/8B-Chat): Qwen3's dense architecture
(per-head q/k RMSNorm, full RoPE). Fields absent from config.json take the defaults of its published configuration class;
fields that its modelling code ignores are checked to mean what that code does.
"""

from __future__ import annotations

from typing import Any

from engine_pod.models.config import ModelConfig, ModelConfigError, MoESpec, as_tuple, qwen_shape, require

LLADA2_MASK_ID = 156895  # <|mask|> of the LLaDA2.0 tokenizer (its generate's default mask_id)
LLADA2_EOS_ID = 156892  # <|endoftext|> (its generate's default eos_id)

# fields the published modelling code does not read, with the only value it implements
_LLADA2_FIXED = {
    "hidden_act": "silu",
    "score_function": "sigmoid",
    "norm_topk_prob": True,
    "norm_head": False,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "rope_scaling": None,
}


def _check_llada2_supported(raw: dict[str, Any]) -> None:
    for key, expected in _LLADA2_FIXED.items():
        if key in raw and raw[key] != expected:
            raise ModelConfigError(
                f"LLaDA2 config field {key}={raw[key]!r} is not supported (expected {expected!r})"
            )


def _llada2_moe(raw: dict[str, Any]) -> MoESpec | None:
    experts = raw.get("num_experts", 16)
    if experts is None:
        return None
    spec = MoESpec(
        num_experts=int(experts),
        experts_per_token=int(raw.get("num_experts_per_tok", 2)),
        expert_intermediate_size=int(require(raw, "moe_intermediate_size")),
        shared_experts=int(raw.get("num_shared_experts") or 0),
        groups=int(raw.get("n_group", 8)),
        groups_per_token=int(raw.get("topk_group", 4)),
        routed_scaling=float(raw.get("routed_scaling_factor", 2.5)),
        first_dense_layers=int(raw.get("first_k_dense_replace", 0)),
    )
    if spec.num_experts % spec.groups:
        raise ModelConfigError(f"{spec.num_experts} experts cannot be split into {spec.groups} groups")
    per_group = spec.num_experts // spec.groups
    if per_group < 2 or spec.groups_per_token > spec.groups:
        raise ModelConfigError("each expert group needs at least 2 experts and topk_group <= n_group")
    if spec.experts_per_token > spec.groups_per_token * per_group:
        raise ModelConfigError("num_experts_per_tok exceeds the experts of the selected groups")
    return spec


def llada2_config(raw: dict[str, Any]) -> ModelConfig:
    """LLaDA2.0's config.json (the LLaDA2MoeConfig field set)."""
    _check_llada2_supported(raw)
    heads = int(require(raw, "num_attention_heads"))
    hidden = int(require(raw, "hidden_size"))
    head_dim = int(raw.get("head_dim") or hidden // heads)
    rotary = int(head_dim * float(raw.get("partial_rotary_factor", 0.5)))
    if rotary % 2 or rotary < 2:
        raise ModelConfigError(
            f"the rotary width {rotary} of a {head_dim}-wide head must be even and positive"
        )
    eos = as_tuple(raw.get("eos_token_id")) or (LLADA2_EOS_ID,)
    return ModelConfig(
        family="llada2",
        hidden_size=hidden,
        num_layers=int(require(raw, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        intermediate_size=int(raw.get("intermediate_size") or 0),
        vocab_size=int(require(raw, "vocab_size")),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        qkv_bias=bool(raw.get("use_qkv_bias", False)),
        mask_token_id=int(raw.get("mask_token_id", LLADA2_MASK_ID)),
        eos_token_ids=eos,
        pad_token_id=raw.get("pad_token_id"),
        max_position_embeddings=int(raw.get("max_position_embeddings", 16384)),
        head_dim_override=head_dim,
        rotary_dim=rotary,
        qk_norm=bool(raw.get("use_qk_norm", False)),
        output_bias=bool(raw.get("use_bias", True)),
        moe=_llada2_moe(raw),
        raw=raw,
    )


SDAR_MASK_ID = 151669  # <|MASK|> of the SDAR tokenizer
SDAR_EOS_ID = 151645  # <|im_end|>: the end of a chat turn
_SDAR_FIXED = {"hidden_act": "silu", "use_sliding_window": False, "rope_scaling": None}


def sdar_config(raw: dict[str, Any]) -> ModelConfig:
    """SDAR's config.json (the SDARConfig field set, Qwen3's names)."""
    for key, expected in _SDAR_FIXED.items():
        if key in raw and raw[key] != expected:
            raise ModelConfigError(
                f"SDAR config field {key}={raw[key]!r} is not supported (expected {expected!r})"
            )
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        family="sdar",
        **qwen_shape(raw),
        qkv_bias=bias,
        mask_token_id=int(raw.get("mask_token_id", SDAR_MASK_ID)),
        eos_token_ids=as_tuple(raw.get("eos_token_id")) or (SDAR_EOS_ID,),
        pad_token_id=raw.get("pad_token_id"),
        max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
        head_dim_override=int(raw.get("head_dim", 128)),
        qk_norm=True,
        output_bias=bias,
        tied_embeddings=bool(raw.get("tie_word_embeddings", False)),
        raw=raw,
    )
