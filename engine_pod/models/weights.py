"""Checkpoint parameter names: the real LLaDA and Dream names mapped onto our module names.

Reads ``model.safetensors`` or a sharded set listed in ``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from engine_pod.models.config import ModelConfig
from engine_pod.progress import tqdm_disable

_LLADA_LAYER = {
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
_DREAM_LAYER = {
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
    "llada": {
        "model.transformer.wte.weight": "embed_tokens.weight",
        "model.transformer.ln_f.weight": "norm.weight",
        "model.transformer.ff_out.weight": "lm_head.weight",
    },
    "dream": {
        "model.embed_tokens.weight": "embed_tokens.weight",
        "model.norm.weight": "norm.weight",
        "lm_head.weight": "lm_head.weight",
    },
}
_LAYER_PREFIX = {"llada": "model.transformer.blocks.{}.", "dream": "model.layers.{}."}
_LAYER_NAMES = {"llada": _LLADA_LAYER, "dream": _DREAM_LAYER}


class CheckpointError(ValueError):
    """The checkpoint's files are missing or do not match its config."""


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


def _block_name_map(config: ModelConfig) -> dict[str, str]:
    ours = ["word_embeddings.weight", "norm.weight"]
    for index in range(config.num_layers):
        ours += _block_layer_names(config, index)
    mapping = {f"model.{name}": name for name in ours}
    mapping["lm_head.weight"] = "lm_head.weight"
    return mapping


PART = "#"  # ours#i: the i-th piece of one of our parameters that the checkpoint stores in pieces


def _sdar_layer_names(config: ModelConfig, index: int) -> dict[str, str]:
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


def _sdar_name_map(config: ModelConfig) -> dict[str, str]:
    mapping = {"model.embed_tokens.weight": "word_embeddings.weight", "model.norm.weight": "norm.weight"}
    if not config.tied_embeddings:
        mapping["lm_head.weight"] = "lm_head.weight"
    for index in range(config.num_layers):
        mapping |= _sdar_layer_names(config, index)
    return mapping


def part_sizes(config: ModelConfig, name: str) -> list[int]:
    """Rows of each piece of a parameter stored in pieces (the fused q/k/v projection)."""
    if "query_key_value" not in name:
        raise CheckpointError(f"{name} is not stored in pieces")
    hd = config.head_dim
    return [config.num_heads * hd, config.num_kv_heads * hd, config.num_kv_heads * hd]


def _join_parts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pieces ``name#0``, ``name#1``... concatenated (along the output rows) into ``name``."""
    pieces: dict[str, dict[int, torch.Tensor]] = {}
    for key in [k for k in state if PART in k]:
        name, index = key.split(PART)
        pieces.setdefault(name, {})[int(index)] = state.pop(key)
    for name, parts in pieces.items():
        state[name] = torch.cat([parts[i] for i in sorted(parts)])
    return state


def name_map(config: ModelConfig) -> dict[str, str]:
    """Checkpoint parameter name -> our module's parameter name, for every parameter of the model."""
    if config.family == "sdar":
        return _sdar_name_map(config)
    if config.block_diffusion:
        return _block_name_map(config)
    mapping = dict(_TOP_LEVEL[config.family])
    for index in range(config.num_layers):
        prefix = _LAYER_PREFIX[config.family].format(index)
        for theirs, ours in _LAYER_NAMES[config.family].items():
            if theirs.endswith(".bias") and not config.qkv_bias:
                continue
            mapping[prefix + theirs] = f"layers.{index}.{ours}"
    return mapping


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / shard for shard in shards]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")


def iter_checkpoint(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in weight_files(model_dir):
        if not path.is_file():
            raise CheckpointError(f"missing weight shard {path}")
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield key, handle.get_tensor(key)


def load_state_dict(config: ModelConfig, model_dir: Path) -> dict[str, torch.Tensor]:
    """Our state dict from the checkpoint, checking that every parameter is present exactly once."""
    mapping = name_map(config)
    state: dict[str, torch.Tensor] = {}
    tensors = tqdm(  # a bar on a terminal only (an 8B checkpoint takes a while to read)
        iter_checkpoint(model_dir),
        total=len(mapping),
        desc="loading weights",
        unit="tensor",
        disable=tqdm_disable(),
    )
    for key, tensor in tensors:
        if key not in mapping:
            if key.endswith("rotary_emb.inv_freq"):
                continue
            raise CheckpointError(f"unexpected parameter {key!r} for a {config.family} checkpoint")
        state[mapping[key]] = tensor
    missing = sorted(set(mapping) - {k for k, v in mapping.items() if v in state})
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} parameters, e.g. {missing[0]!r}")
    state = _join_parts(state)
    if config.tied_embeddings:
        state["lm_head.weight"] = state["word_embeddings.weight"]
    return state


def save_checkpoint(config: ModelConfig, state: dict[str, torch.Tensor], model_dir: Path) -> None:
    """Write our state dict under the real checkpoint's parameter names."""
    inverse = {ours: theirs for theirs, ours in name_map(config).items()}
    state = dict(state)
    for name in [n for n in state if f"{n}{PART}0" in inverse]:  # pieces the checkpoint keeps apart
        for index, piece in enumerate(state.pop(name).split(part_sizes(config, name))):
            state[f"{name}{PART}{index}"] = piece
    tensors = {inverse[name]: tensor.contiguous() for name, tensor in state.items() if name in inverse}
    save_file(tensors, str(Path(model_dir) / "model.safetensors"), metadata={"format": "pt"})
