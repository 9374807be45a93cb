"""LLaDA2.0 (``model_type: llada2_moe``, inclusionAI's LLaDA2.0-mini and -flash): block diffusion on Ling's
mixture-of-experts architecture, causal across blocks and bidirectional inside one, decoded with an exact
KV cache of committed blocks. A field absent from config.json takes the default of its published
configuration class (the table below, naming its source), as the reference loader does; a field the engine
does not implement is refused by name unless it has the one value implemented."""

from __future__ import annotations

from typing import Any

from dllm_contracts.defaults import DEFAULT_BLOCK_LENGTH
from dllm_contracts.families import FamilyDecoding
from engine_pod.families.record import ModelFamily
from engine_pod.kinds.block_causal.kind import BLOCK_CAUSAL
from engine_pod.models.block_transformer import BlockDiffusionTransformer
from engine_pod.models.config import ModelConfig, ModelConfigError, MoESpec, as_tuple, mlp_activation
from engine_pod.models.config_fields import check_fixed, needed, reader_with_defaults
from engine_pod.parallel.block_shards import BlockShards

NAME = "llada2"

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
    "score_function",
    "norm_topk_prob",
    "norm_head",
    "tie_word_embeddings",
    "use_sliding_window",
    "rope_scaling",
)


def _llada2_moe(get) -> MoESpec | None:
    experts = get("num_experts")
    if experts is None:
        return None
    spec = MoESpec(
        num_experts=int(experts),
        experts_per_token=int(get("num_experts_per_tok")),
        expert_intermediate_size=needed(get, "moe_intermediate_size", "the mixture-of-experts layers"),
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
    get = reader_with_defaults(raw, LLADA2_DEFAULTS)
    check_fixed("LLaDA2", get, LLADA2_DEFAULTS, _LLADA2_FIXED)
    heads = int(get("num_attention_heads"))
    hidden = int(get("hidden_size"))
    head_dim = int(get("head_dim") or hidden // heads)
    moe = _llada2_moe(get)
    layers = int(get("num_hidden_layers"))
    dense = moe is None or moe.first_dense_layers > 0
    return ModelConfig(
        family=NAME,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(get("num_key_value_heads") or heads),
        intermediate_size=needed(get, "intermediate_size", "the dense layers") if dense else 0,
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
        activation=mlp_activation(get("hidden_act"), "hidden_act"),
        raw=raw,
    )


def _swiglu_names(prefix: str) -> list[str]:
    return [f"{prefix}.{part}_proj.weight" for part in ("gate", "up", "down")]


def _block_layer_names(config: ModelConfig, index: int) -> list[str]:
    """Our (= the checkpoint's, less ``model.``) names of one LLaDA2.0 layer."""
    names = ["input_layernorm.weight", "post_attention_layernorm.weight", "attention.query_key_value.weight"]
    names += ["attention.query_key_value.bias"] if config.qkv_bias else []
    names += ["attention.query_layernorm.weight", "attention.key_layernorm.weight"] if config.qk_norm else []
    names += ["attention.dense.weight"] + (["attention.dense.bias"] if config.output_bias else [])
    moe = config.moe
    if moe is None or index < moe.first_dense_layers:
        names += _swiglu_names("mlp")
    else:
        names += ["mlp.gate.weight", "mlp.gate.expert_bias"]
        for expert in range(moe.num_experts):
            names += _swiglu_names(f"mlp.experts.{expert}")
        names += _swiglu_names("mlp.shared_experts") if moe.shared_experts else []
    return [f"layers.{index}.{name}" for name in names]


def llada2_name_map(config: ModelConfig) -> dict[str, str]:
    """LLaDA2.0's checkpoint names -> ours (the same, less ``model.``), for every parameter."""
    ours = ["word_embeddings.weight", "norm.weight"]
    for index in range(config.num_layers):
        ours += _block_layer_names(config, index)
    mapping = {f"model.{name}": name for name in ours}
    mapping["lm_head.weight"] = "lm_head.weight"
    return mapping


FAMILY = ModelFamily(
    name=NAME,
    display_name="LLaDA2.0",
    summary="LLaDA2.0, block diffusion with an exact KV cache, a mixture of experts",
    model_types=("llada2_moe",),
    read_config=llada2_config,
    architecture=BlockDiffusionTransformer,
    kind=BLOCK_CAUSAL,
    checkpoints="inclusionAI/LLaDA2.0-mini (mixture of experts)",
    tiny_preset="llada2-tiny",
    decoding=FamilyDecoding(block_length=DEFAULT_BLOCK_LENGTH, steps_per_block=DEFAULT_BLOCK_LENGTH),
    name_map=llada2_name_map,
    tensor_parallel=BlockShards,
    expert_parallel=True,
    steps_capped_by_length=True,  # its reference generate caps a block's steps by the generation length
)
