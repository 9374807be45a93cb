"""DiffusionGemma's config.json (``model_type: diffusion_gemma``) read into one frozen dataclass.

Owns the field defaults and their resolution. A field absent from config.json takes the default of the
reference configuration classes (``DiffusionGemmaConfig`` and ``DiffusionGemmaTextConfig`` of
transformers 5.24.0, ``models/diffusion_gemma/configuration_diffusion_gemma.py``), resolved as their
``__post_init__`` does: the default layer pattern (five sliding-window layers, then a full one; the last
layer always full), the full-attention layers' wider heads (``per_layer_config``, or Gemma 4's
``global_head_dim`` / ``num_global_key_value_heads``) and the per-layer-type RoPE parameters. The
multimodal parts are refused or set aside in ``multimodal.py``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine_pod.families.diffusion_gemma.multimodal import check_config_sections
from engine_pod.models.config import ModelConfigError, as_tuple

logger = logging.getLogger(__name__)

MODEL_TYPE = "diffusion_gemma"
SLIDING, FULL = "sliding_attention", "full_attention"
# DiffusionGemmaTextConfig's field defaults (plus the kwargs its __post_init__ pops)
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_144,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "rope_parameters": None,
    "attention_bias": False,
    "sliding_window": 512,
    "layer_types": None,
    "final_logit_softcapping": 30.0,  # a class attribute there, overridden by config.json
    "use_bidirectional_attention": None,
    "num_experts": None,
    "top_k_experts": None,
    "moe_intermediate_size": None,
    "per_layer_config": None,
    "global_head_dim": 512,
    "num_global_key_value_heads": None,
}
# DiffusionGemmaConfig's field defaults
TOP_DEFAULTS: dict[str, Any] = {
    "text_config": None,
    "boi_token_id": 255_999,
    "eoi_token_id": 258_882,
    "image_token_id": 258_880,
    "tie_word_embeddings": True,
    "canvas_length": 256,
}
DEFAULT_ROPE: dict[str, dict[str, Any]] = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
SLIDING_PATTERN = 6  # every sixth layer is a full-attention one
_PER_LAYER_FIELDS = ("head_dim", "num_key_value_heads")


@dataclass(frozen=True)
class RopeSpec:
    """One layer type's rotary embedding: ``default`` (every dimension) or Gemma's ``proportional``
    (the first ``partial_rotary_factor`` of each half rotated, the rest with frequency zero)."""

    rope_type: str
    theta: float
    partial_rotary_factor: float = 1.0
    factor: float = 1.0


@dataclass(frozen=True)
class DiffusionGemmaConfig:
    """The text model of DiffusionGemma: a causal encoder and a bidirectional canvas decoder that share
    every layer weight (``tie_word_embeddings``), each layer a dense GeGLU MLP beside a mixture of experts."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense MLP's and the self-conditioning MLP's width
    num_layers: int
    num_heads: int
    layer_types: tuple[str, ...]  # "sliding_attention" or "full_attention", one per layer
    layer_head_dims: tuple[int, ...]  # per layer: full-attention layers have wider heads
    layer_kv_heads: tuple[int, ...]
    sliding_window: int  # a sliding layer's query sees itself and the window - 1 keys before it
    rope: dict[str, RopeSpec]  # per layer type
    num_experts: int
    top_k_experts: int
    moe_intermediate_size: int
    rms_norm_eps: float
    final_logit_softcapping: float
    attention_bias: bool
    pad_token_id: int | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    canvas_length: int  # tokens denoised together: the block of block diffusion
    tie_word_embeddings: bool  # encoder layers, embeddings and LM head are the decoder's tensors
    max_position_embeddings: int
    image_token_id: int | None
    boi_token_id: int | None
    eoi_token_id: int | None
    use_bidirectional_attention: str | None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # generation_config.json as read (the sampler's defaults: ``EntropyBoundParams.from_generation_config``)
    generation: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # what the engine reads of every family's config (``models/config.py``'s ModelConfig)
    family = MODEL_TYPE
    mask_token_id = None  # uniform noise, no mask token

    def with_eos(self, eos_token_ids: tuple[int, ...]) -> DiffusionGemmaConfig:
        return replace(self, eos_token_ids=tuple(eos_token_ids))

    def with_sampler(self, **settings: Any) -> DiffusionGemmaConfig:
        """The generation config with the sampler's ``settings`` (``EntropyBoundParams``' names; None
        leaves one as it is) set where generation_config.json keeps them."""
        given = {name: value for name, value in settings.items() if value is not None}
        generation = {**self.generation, **given}
        if "entropy_bound" in given:
            sampler = {**(generation.get("sampler_config") or {}), "entropy_bound": given["entropy_bound"]}
            generation["sampler_config"] = sampler
            del generation["entropy_bound"]
        return replace(self, generation=generation)

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == SLIDING

    @property
    def multimodal_token_ids(self) -> dict[str, int]:
        """The special tokens that only an image input may carry, by config field name."""
        names = ("image_token_id", "boi_token_id", "eoi_token_id")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def _text_reader(raw_text: dict[str, Any]):
    def get(key: str) -> Any:
        return raw_text[key] if key in raw_text else TEXT_DEFAULTS[key]

    return get


def _layer_types(get, layers: int) -> tuple[str, ...]:
    types = get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % SLIDING_PATTERN else FULL for i in range(layers)]
    types = list(types)
    if len(types) != layers:
        raise ModelConfigError(
            f"num_hidden_layers ({layers}) must equal the number of layer_types ({len(types)})"
        )
    unknown = sorted(set(types) - {SLIDING, FULL})
    if unknown:
        raise ModelConfigError(f"layer_types {unknown} are not supported (expected {SLIDING!r} or {FULL!r})")
    if types and types[-1] != FULL:
        logger.warning("the last layer must use full attention; forcing it, as the reference does")
        types[-1] = FULL
    return tuple(types)


def _per_layer(get, types: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each layer's head width and KV heads: the sliding layers the global fields, the full layers
    their overrides (``per_layer_config``, or else ``global_head_dim`` / ``num_global_key_value_heads``)."""
    head_dim, kv_heads = int(get("head_dim")), int(get("num_key_value_heads"))
    overrides = get("per_layer_config")
    if overrides is None:
        full = {"head_dim": int(get("global_head_dim"))}
        if get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = int(get("num_global_key_value_heads"))
        overrides = {str(i): full for i, kind in enumerate(types) if kind == FULL}
    per_layer = [{"head_dim": head_dim, "num_key_value_heads": kv_heads} for _ in types]
    for key, values in overrides.items():
        index = int(key)
        if not 0 <= index < len(types):
            raise ModelConfigError(f"per_layer_config names layer {key}, outside the {len(types)} layers")
        unknown = sorted(set(values) - set(_PER_LAYER_FIELDS))
        if unknown:
            raise ModelConfigError(f"per_layer_config field(s) {unknown} are not supported")
        per_layer[index].update({name: int(value) for name, value in values.items()})
    return tuple(p["head_dim"] for p in per_layer), tuple(p["num_key_value_heads"] for p in per_layer)


def _rope(get, types: tuple[str, ...], head_dims: tuple[int, ...]) -> dict[str, RopeSpec]:
    params = get("rope_parameters") or DEFAULT_ROPE
    specs = {}
    for kind in sorted(set(types)):
        if kind not in params:
            raise ModelConfigError(f"rope_parameters has no entry for the {kind} layers")
        entry = params[kind]
        rope_type = entry.get("rope_type", "default")
        if rope_type not in ("default", "proportional"):
            raise ModelConfigError(f"rope_type {rope_type!r} is not supported (default or proportional)")
        spec = RopeSpec(
            rope_type=rope_type,
            theta=float(entry["rope_theta"]),
            partial_rotary_factor=float(entry.get("partial_rotary_factor", 1.0)),
            factor=float(entry.get("factor", 1.0)),
        )
        if rope_type == "default" and (spec.partial_rotary_factor != 1.0 or spec.factor != 1.0):
            raise ModelConfigError("default RoPE with partial_rotary_factor or factor is not supported")
        widths = {d for d, t in zip(head_dims, types) if t == kind}
        if len(widths) > 1:
            raise ModelConfigError(f"the {kind} layers have different head widths {sorted(widths)}")
        specs[kind] = spec
    return specs


def _needed(get, key: str) -> int:
    value = get(key)
    if value is None:
        raise ModelConfigError(f"config.json has no text_config.{key}, which the mixture of experts needs")
    return int(value)


def _check_supported(get) -> None:
    if get("hidden_activation") != "gelu_pytorch_tanh":
        raise ModelConfigError(
            f"hidden_activation {get('hidden_activation')!r} is not supported (gelu_pytorch_tanh)"
        )
    if get("use_bidirectional_attention") not in (None, "vision"):
        raise ModelConfigError(
            f"use_bidirectional_attention={get('use_bidirectional_attention')!r} (a bidirectional encoder) is "
            "not supported: the text path encodes causally (None, or 'vision', which differs only for images)"
        )
    if get("final_logit_softcapping") is None:
        raise ModelConfigError("final_logit_softcapping must be a number (the reference divides by it)")


def diffusion_gemma_config(raw: dict[str, Any]) -> DiffusionGemmaConfig:
    """DiffusionGemma's config.json, with the reference configuration classes' defaults."""
    if raw.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise ModelConfigError(f"model_type {raw.get('model_type')!r} is not {MODEL_TYPE!r}")
    check_config_sections(raw)
    top = {**TOP_DEFAULTS, **raw}
    get = _text_reader(top["text_config"] or {})
    _check_supported(get)
    layers = int(get("num_hidden_layers"))
    types = _layer_types(get, layers)
    head_dims, kv_heads = _per_layer(get, types)
    heads = int(get("num_attention_heads"))
    for kv in set(kv_heads):
        if heads % kv:
            raise ModelConfigError(f"{heads} attention heads are not a multiple of {kv} KV heads")
    eos = as_tuple(get("eos_token_id"))
    return DiffusionGemmaConfig(
        vocab_size=int(get("vocab_size")),
        hidden_size=int(get("hidden_size")),
        intermediate_size=int(get("intermediate_size")),
        num_layers=layers,
        num_heads=heads,
        layer_types=types,
        layer_head_dims=head_dims,
        layer_kv_heads=kv_heads,
        sliding_window=int(get("sliding_window")),
        rope=_rope(get, types, head_dims),
        num_experts=_needed(get, "num_experts"),
        top_k_experts=_needed(get, "top_k_experts"),
        moe_intermediate_size=_needed(get, "moe_intermediate_size"),
        rms_norm_eps=float(get("rms_norm_eps")),
        final_logit_softcapping=float(get("final_logit_softcapping")),
        attention_bias=bool(get("attention_bias")),
        pad_token_id=get("pad_token_id"),
        eos_token_ids=eos,
        bos_token_id=get("bos_token_id"),
        canvas_length=int(top["canvas_length"]),
        tie_word_embeddings=bool(top["tie_word_embeddings"]),
        max_position_embeddings=int(get("max_position_embeddings")),
        image_token_id=top["image_token_id"],
        boi_token_id=top["boi_token_id"],
        eoi_token_id=top["eoi_token_id"],
        use_bidirectional_attention=get("use_bidirectional_attention"),
        raw=raw,
    )


def load_diffusion_gemma_config(model_dir: Path) -> DiffusionGemmaConfig:
    """config.json with generation_config.json beside it, where there is one: the reference's generate
    takes its EOS ids from the generation config (the text config's where it names none) and its sampler
    settings from it."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelConfigError(f"no config.json in {model_dir}")
    config = diffusion_gemma_config(json.loads(path.read_text()))
    generation_path = Path(model_dir) / "generation_config.json"
    if not generation_path.is_file():
        return config
    generation = json.loads(generation_path.read_text())
    eos = as_tuple(generation.get("eos_token_id")) or config.eos_token_ids
    return replace(config, generation=generation, eos_token_ids=eos)
