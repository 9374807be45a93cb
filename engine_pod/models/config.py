"""Model configuration: one frozen dataclass, which each Llama-style family's reader fills from a real
checkpoint's ``config.json`` (the readers live in the families' modules, ``engine_pod/families/``), with
the field helpers they share."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


class ModelConfigError(ValueError):
    """The checkpoint's config.json describes a model this engine cannot run."""


# The MLP's gate activation, by the name config.json gives it (transformers' ACT2FN names, which OLMo's
# activation_type shares): the torch.nn.functional function that computes it and its keyword arguments.
MLP_ACTIVATIONS: dict[str, tuple[str, dict[str, str]]] = {
    "silu": ("silu", {}),
    "gelu": ("gelu", {}),  # exact, with erf
    "gelu_pytorch_tanh": ("gelu", {"approximate": "tanh"}),
    "relu": ("relu", {}),
}


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
    held: tuple[int, int] | None = None  # (first, count) of the routed experts this process holds (None: all)
    shared_width: int | None = (
        None  # the shared experts' hidden units here (None: shared_experts x the width)
    )

    @property
    def held_experts(self) -> range:
        """The whole model's routed experts this process holds (an expert-parallel rank: its set)."""
        first, count = self.held or (0, self.num_experts)
        return range(first, first + count)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and special tokens of a bidirectional Llama/Qwen2-style diffusion LM."""

    family: str  # its family's name (engine_pod/families/registry.py), which the engine reads it by
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
    activation: str = "silu"  # the MLP's gate activation: a name of MLP_ACTIVATIONS
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_heads

    def __post_init__(self) -> None:
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
        mlp_activation(self.activation, "activation")

    def with_eos(self, eos_token_ids: tuple[int, ...]) -> ModelConfig:
        return replace(self, eos_token_ids=eos_token_ids)


def as_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def mlp_activation(value: Any, field: str) -> str:
    """config.json's ``field``, the MLP's activation; refused by name unless MLP_ACTIVATIONS has it."""
    name = str(value)
    if name not in MLP_ACTIVATIONS:
        raise ModelConfigError(
            f"config field {field}={value!r} is not supported (an MLP activation: {', '.join(MLP_ACTIVATIONS)})"
        )
    return name


def require(raw: dict[str, Any], key: str) -> Any:
    if key not in raw:
        raise ModelConfigError(f"config.json has no field {key!r}")
    return raw[key]


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
