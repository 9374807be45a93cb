"""config.json of the block-diffusion families, read into a ModelConfig.

LLaDA2.0 (``model_type: llada2_moe``, inclusionAI's LLaDA2.0-mini and -flash): Ling's MoE
architecture. SDAR (``model_type: sdar``, JetLM's SDAR-1.7B/4B/8B-Chat): Qwen3's dense architecture
(per-head q/k RMSNorm, full RoPE). A field absent from config.json takes the default of the family's
published configuration class (the tables below, each naming its source), as the reference loader
does; a field the engine does not implement is refused by name unless it has the one value implemented.
"""

from __future__ import annotations

from typing import Any

from engine_pod.models.config import ModelConfig, ModelConfigError, MoESpec, as_tuple

# LLaDA2MoeConfig.__init__'s defaults: configuration_llada2_moe.py as published with
# inclusionAI/LLaDA2.0-mini (mirrored in ZHZisZZ/dllm, dllm/pipelines/llada2/models, commit ca176752).
# inclusionAI/dFactory's copy (models/llada2_moe, commit 92b6890) defaults use_qk_norm to False but its
# modelling applies the q/k norms whatever the field says: with either, an absent field means q/k norms.
LLADA2_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30592,
    "hidden_size": 1024,
    "intermediate_size": None,  # needed by the dense layers (first_k_dense_replace, or num_experts None)
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 0,  # 0 or None: as many as the query heads
    "hidden_act": "silu",
    "use_qkv_bias": False,
    "use_qk_norm": True,
    "use_bias": True,
    "rms_norm_eps": 1e-05,
    "norm_head": False,
    "tie_word_embeddings": False,
    "max_position_embeddings": 16384,
    "rope_theta": 10000.0,
    "use_sliding_window": False,
    "rope_scaling": None,
    "pad_token_id": 126081,
    "num_experts": 16,
    "num_shared_experts": 0,
    "num_experts_per_tok": 2,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "moe_intermediate_size": None,  # needed by the mixture-of-experts layers
    "first_k_dense_replace": 0,
    "head_dim": None,  # None: hidden_size // num_attention_heads
    "partial_rotary_factor": 0.5,
    # not in the class: the defaults of the reference generate's eos_id and mask_id
    "eos_token_id": 156892,  # <|endoftext|>
    "mask_token_id": 156895,  # <|mask|>
    # not in the class, not read by its modelling: the one behaviour that modelling has
    "score_function": "sigmoid",
    "norm_topk_prob": True,
}
LLADA2_MASK_ID = LLADA2_DEFAULTS["mask_token_id"]
LLADA2_EOS_ID = LLADA2_DEFAULTS["eos_token_id"]
# fields whose every other value the engine (and the reference modelling) does not implement
_LLADA2_FIXED = (
    "hidden_act",
    "score_function",
    "norm_topk_prob",
    "norm_head",
    "tie_word_embeddings",
    "use_sliding_window",
    "rope_scaling",
)

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
_SDAR_FIXED = ("hidden_act", "use_sliding_window", "rope_scaling")


def _reader(raw: dict[str, Any], defaults: dict[str, Any]):
    """``get(key)``: config.json's value, or the reference class's default when the field is absent."""

    def get(key: str) -> Any:
        return raw[key] if key in raw else defaults[key]

    return get


def _check_fixed(family: str, get, defaults: dict[str, Any], fixed: tuple[str, ...]) -> None:
    for key in fixed:
        if get(key) != defaults[key]:
            raise ModelConfigError(
                f"{family} config field {key}={get(key)!r} is not supported (expected {defaults[key]!r})"
            )


def _needed(get, key: str, why: str) -> int:
    value = get(key)
    if value is None:
        raise ModelConfigError(f"config.json has no {key}, which {why} need")
    return int(value)


def _llada2_moe(get) -> MoESpec | None:
    experts = get("num_experts")
    if experts is None:
        return None
    spec = MoESpec(
        num_experts=int(experts),
        experts_per_token=int(get("num_experts_per_tok")),
        expert_intermediate_size=_needed(get, "moe_intermediate_size", "the mixture-of-experts layers"),
        shared_experts=int(get("num_shared_experts") or 0),
        groups=int(get("n_group")),
        groups_per_token=int(get("topk_group")),
        routed_scaling=float(get("routed_scaling_factor")),
        first_dense_layers=int(get("first_k_dense_replace")),
    )
    if spec.num_experts % spec.groups:
        raise ModelConfigError(f"{spec.num_experts} experts cannot be split into {spec.groups} groups")
    per_group = spec.num_experts // spec.groups
    if per_group < 2 or spec.groups_per_token > spec.groups:
        raise ModelConfigError("each expert group needs at least 2 experts and topk_group <= n_group")
    if spec.experts_per_token > spec.groups_per_token * per_group:
        raise ModelConfigError("num_experts_per_tok exceeds the experts of the selected groups")
    return spec


def _llada2_rotary(get, head_dim: int) -> int:
    rotary = int(head_dim * float(get("partial_rotary_factor")))
    if rotary % 2 or rotary < 2:
        raise ModelConfigError(
            f"the rotary width {rotary} of a {head_dim}-wide head must be even and positive"
        )
    return rotary


def llada2_config(raw: dict[str, Any]) -> ModelConfig:
    """LLaDA2.0's config.json (the LLaDA2MoeConfig field set)."""
    get = _reader(raw, LLADA2_DEFAULTS)
    _check_fixed("LLaDA2", get, LLADA2_DEFAULTS, _LLADA2_FIXED)
    heads = int(get("num_attention_heads"))
    hidden = int(get("hidden_size"))
    head_dim = int(get("head_dim") or hidden // heads)
    moe = _llada2_moe(get)
    layers = int(get("num_hidden_layers"))
    dense = moe is None or moe.first_dense_layers > 0
    return ModelConfig(
        family="llada2",
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(get("num_key_value_heads") or heads),
        intermediate_size=_needed(get, "intermediate_size", "the dense layers") if dense else 0,
        vocab_size=int(get("vocab_size")),
        rope_theta=float(get("rope_theta")),
        rms_norm_eps=float(get("rms_norm_eps")),
        qkv_bias=bool(get("use_qkv_bias")),
        mask_token_id=int(get("mask_token_id")),
        eos_token_ids=as_tuple(get("eos_token_id")) or (LLADA2_EOS_ID,),
        pad_token_id=get("pad_token_id"),
        max_position_embeddings=int(get("max_position_embeddings")),
        head_dim_override=head_dim,
        rotary_dim=_llada2_rotary(get, head_dim),
        qk_norm=bool(get("use_qk_norm")),
        output_bias=bool(get("use_bias")),
        moe=moe,
        raw=raw,
    )


def sdar_config(raw: dict[str, Any]) -> ModelConfig:
    """SDAR's config.json (the SDARConfig field set, Qwen3's names)."""
    get = _reader(raw, SDAR_DEFAULTS)
    _check_fixed("SDAR", get, SDAR_DEFAULTS, _SDAR_FIXED)
    heads = int(get("num_attention_heads"))
    bias = bool(get("attention_bias"))
    return ModelConfig(
        family="sdar",
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
        raw=raw,
    )
