"""Model configuration: one frozen dataclass read from a real checkpoint's ``config.json``.

LLaDA (``model_type: llada``) and Dream (``model_type: Dream``, Qwen2 field names) use different
field names for the same architecture; this module owns the translation and its validation. The
block-diffusion families (LLaDA2.0, ``model_type: llada2_moe``) add their fields in
``block_config.py``; ``config_readers.py`` picks a family's reader by ``model_type``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dllm_contracts.families import FAMILIES

BLOCK_DIFFUSION_FAMILIES = ("llada2", "sdar")  # causal across blocks, bidirectional inside one


class ModelConfigError(ValueError):
    """The checkpoint's config.json describes a model this engine cannot run."""


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts MLP: sigmoid router with an expert bias, group-limited top-k, shared experts."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_experts: int  # always-active experts, as one MLP of shared_experts x the expert width
    groups: int  # experts are split into this many groups ...
    groups_per_token: int  # ... and a token's experts come from its best groups only
    routed_scaling: float  # the routed experts' weights are scaled by this after normalisation
    first_dense_layers: int  # the first layers keep a dense MLP


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and special tokens of a bidirectional Llama/Qwen2-style diffusion LM."""

    family: str  # "llada" or "dream": decides parameter names and decoding quirks
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    qkv_bias: bool  # Dream (Qwen2) has q/k/v biases, LLaDA none
    mask_token_id: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None = None
    max_position_embeddings: int = 4096
    head_dim_override: int | None = None  # config.json's head_dim where it is not hidden / heads
    rotary_dim: int | None = None  # RoPE on the first rotary_dim dimensions of a head (None: all)
    qk_norm: bool = False  # RMSNorm over each head's queries and keys before RoPE
    output_bias: bool = False  # the attention output projection has a bias
    moe: MoESpec | None = None
    tied_embeddings: bool = False  # the LM head is the input embedding (no lm_head.weight in the checkpoint)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_heads

    @property
    def block_diffusion(self) -> bool:
        """Attention is causal across blocks and bidirectional inside one: a committed block's K/V is final."""
        return self.family in BLOCK_DIFFUSION_FAMILIES

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ModelConfigError(f"unknown model family {self.family!r}; expected one of {FAMILIES}")
        if self.head_dim_override is None and self.hidden_size % self.num_heads:
            raise ModelConfigError(
                f"hidden size {self.hidden_size} is not divisible by {self.num_heads} heads"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"{self.num_heads} heads are not divisible by {self.num_kv_heads} KV heads"
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ModelConfigError(f"mask token id {self.mask_token_id} is outside the vocabulary")

    def with_eos(self, eos_token_ids: tuple[int, ...]) -> ModelConfig:
        return replace(self, eos_token_ids=eos_token_ids)


def as_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def require(raw: dict[str, Any], key: str) -> Any:
    if key not in raw:
        raise ModelConfigError(f"config.json has no field {key!r}")
    return raw[key]


def _check_llada_supported(raw: dict[str, Any]) -> None:
    unsupported = {
        "alibi": (raw.get("alibi", False), False),
        "rope": (raw.get("rope", True), True),
        "block_type": (raw.get("block_type", "llama"), "llama"),
        "layer_norm_type": (raw.get("layer_norm_type", "rms"), "rms"),
        "activation_type": (raw.get("activation_type", "silu"), "silu"),
        "weight_tying": (raw.get("weight_tying", False), False),
    }
    for key, (value, expected) in unsupported.items():
        if value != expected:
            raise ModelConfigError(
                f"LLaDA config field {key}={value!r} is not supported (expected {expected!r})"
            )


def llada_config(raw: dict[str, Any]) -> ModelConfig:
    _check_llada_supported(raw)
    d_model = int(require(raw, "d_model"))
    n_heads = int(require(raw, "n_heads"))
    n_kv = raw.get("n_kv_heads") or (1 if raw.get("multi_query_attention") else n_heads)
    mlp_hidden = raw.get("mlp_hidden_size") or int(raw.get("mlp_ratio", 4) * d_model)
    vocab = int(raw.get("embedding_size") or require(raw, "vocab_size"))
    return ModelConfig(
        family="llada",
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
        raw=raw,
    )


def qwen_shape(raw: dict[str, Any]) -> dict[str, Any]:
    """The architecture fields Qwen2/Qwen3-style config.json files (Dream, SDAR) name alike."""
    heads = int(require(raw, "num_attention_heads"))
    return {
        "hidden_size": int(require(raw, "hidden_size")),
        "num_layers": int(require(raw, "num_hidden_layers")),
        "num_heads": heads,
        "num_kv_heads": int(raw.get("num_key_value_heads") or heads),
        "intermediate_size": int(require(raw, "intermediate_size")),
        "vocab_size": int(require(raw, "vocab_size")),
        "rope_theta": float(raw.get("rope_theta", 10000.0)),
        "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
    }


def dream_config(raw: dict[str, Any]) -> ModelConfig:
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelConfigError(
            f"Dream hidden_act={raw.get('hidden_act')!r} is not supported (expected 'silu')"
        )
    return ModelConfig(
        family="dream",
        **qwen_shape(raw),
        qkv_bias=True,
        mask_token_id=int(raw.get("mask_token_id", 151666)),
        eos_token_ids=as_tuple(raw.get("eos_token_id", 151643)),
        pad_token_id=raw.get("pad_token_id"),
        max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
        raw=raw,
    )
