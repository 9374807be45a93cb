"""Test factories: tiny random checkpoints in the real on-disk formats, and request workloads."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine_pod.loading.config_readers import config_from_dict
from engine_pod.loading.weights import name_map
from engine_pod.models.checkpoint_files import PART, part_sizes

VENDORED_REFERENCE = Path(__file__).resolve().parent / "data" / "reference"
SHARED_REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"


def _reference_dir() -> Path:
    """The reference vectors: $DLLM_REFERENCE_DIR, else ../shared/reference, else the copy vendored here."""
    if os.environ.get("DLLM_REFERENCE_DIR"):
        return Path(os.environ["DLLM_REFERENCE_DIR"])
    return SHARED_REFERENCE if (SHARED_REFERENCE / "llada" / "config.json").is_file() else VENDORED_REFERENCE


REFERENCE_DIR = _reference_dir()
BLOCK_REFERENCE_DIR = Path(__file__).resolve().parent / "data" / "block_reference"  # LLaDA2.0 and SDAR


def llada_config(
    d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp=128, vocab=512, mask=500, eos=501
) -> dict:
    return {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "d_model": d_model,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "mlp_hidden_size": mlp,
        "embedding_size": vocab,
        "vocab_size": vocab,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "mask_token_id": mask,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "include_bias": False,
        "include_qkv_bias": False,
        "block_type": "llama",
        "layer_norm_type": "rms",
        "activation_type": "silu",
        "rope": True,
        "alibi": False,
        "weight_tying": False,
    }


def dream_config(
    hidden=64, layers=2, heads=4, kv_heads=2, intermediate=160, vocab=512, mask=500, eos=501
) -> dict:
    return {
        "model_type": "Dream",
        "architectures": ["DreamModel"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "mask_token_id": mask,
        "eos_token_id": eos,
        "bos_token_id": eos,
        "pad_token_id": eos,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }


def _init(name: str, shape: tuple[int, ...], generator: torch.Generator, hidden: int) -> torch.Tensor:
    """Reference-style init: peaked LM head, unit-scale embeddings, 1 + 0.1 N norms."""
    noise = torch.randn(shape, generator=generator)
    if name.endswith("norm.weight") or "ln_f" in name or "layernorm" in name:
        return 1 + 0.1 * noise
    if name.endswith(".bias") or name.endswith("expert_bias"):
        return 0.1 * noise
    if "wte" in name or "embed_tokens" in name or "word_embeddings" in name:
        return noise
    if name in ("model.transformer.ff_out.weight", "lm_head.weight"):
        return 5 / math.sqrt(hidden) * noise
    scale = 3 if any(k in name for k in ("q_proj", "k_proj")) else 2
    return scale / math.sqrt(shape[1]) * noise


def _qwen_shaped(
    hidden: int, layers: int, heads: int, kv_heads: int, vocab: int, mask: int, eos: int
) -> dict:
    """The Qwen-style fields the block-diffusion families share (a SwiGLU twice the hidden width)."""
    return {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "mask_token_id": mask,
        "eos_token_id": eos,
        "pad_token_id": eos,
    }


def llada2_config(hidden=32, layers=2, heads=4, kv_heads=2, experts=4, vocab=512, mask=500, eos=501) -> dict:
    """LLaDA2.0's field set (llada2_moe): layer 0 dense, the others a mixture of ``experts`` experts."""
    return {
        "model_type": "llada2_moe",
        "architectures": ["LLaDA2MoeModelLM"],
        **_qwen_shaped(hidden, layers, heads, kv_heads, vocab, mask, eos),
        "partial_rotary_factor": 0.5,
        "use_qk_norm": True,
        "use_qkv_bias": False,
        "use_bias": False,
        "rope_theta": 600000,
        "num_experts": experts,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "n_group": 2,
        "topk_group": 1,
        "moe_intermediate_size": hidden // 2,
        "first_k_dense_replace": 1,
        "tie_word_embeddings": False,
    }


def sdar_config(hidden=32, layers=2, heads=4, kv_heads=2, vocab=512, mask=500, eos=501, tie=False) -> dict:
    """SDAR's field set (Qwen3's names, model_type sdar); ``tie``: the LM head is the embedding."""
    return {
        "model_type": "sdar",
        "architectures": ["SDARForCausalLM"],
        **_qwen_shaped(hidden, layers, heads, kv_heads, vocab, mask, eos),
        "rope_theta": 1000000.0,
        "attention_bias": False,
        "tie_word_embeddings": tie,
    }


_HEAD = {
    "llada": "model.transformer.ff_out.weight",
    "dream": "lm_head.weight",
    "llada2": "lm_head.weight",
    "sdar": "lm_head.weight",
}
_EMBEDDING = {
    "llada": "model.transformer.wte.weight",
    "dream": "model.embed_tokens.weight",
    "llada2": "model.word_embeddings.weight",
    "sdar": "model.embed_tokens.weight",
}


def write_checkpoint(directory: Path, raw_config: dict, seed: int = 0) -> Path:
    """A random checkpoint under the real parameter names, with the reference's [MASK] edits."""
    directory.mkdir(parents=True, exist_ok=True)
    config = config_from_dict(raw_config)
    generator = torch.Generator().manual_seed(seed)
    shapes = _shapes(config)
    tensors = {}
    for name in sorted(shapes):
        tensors[name] = _init(name, shapes[name], generator, config.hidden_size).contiguous()
    head, embed = _HEAD[config.family], _EMBEDDING[config.family]
    if head in tensors:  # a tied head is the embedding: its [MASK] row only scaled below
        tensors[head][config.mask_token_id] = 0.0
    tensors[embed][config.mask_token_id] *= 0.3
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(raw_config, indent=2))
    return directory


def _shapes(config) -> dict[str, tuple[int, ...]]:
    from engine_pod.loading.loader import build_model

    model = build_model(config, torch.device("meta"), torch.float32)
    ours = {name: tuple(p.shape) for name, p in model.named_parameters()}

    def shape(mine: str) -> tuple[int, ...]:
        if PART not in mine:
            return ours[mine]
        name, piece = mine.split(PART)  # a piece the checkpoint keeps apart (SDAR's q, k, v)
        return (part_sizes(config, name)[int(piece)], *ours[name][1:])

    return {theirs: shape(mine) for theirs, mine in name_map(config).items()}


def random_workload(
    rng: random.Random, n: int, vocab: int, block: int, max_prompt: int = 40, max_blocks: int = 4
):
    """(request id, prompt ids, generation budget) triples with varied prompts and budgets."""
    return [
        (
            f"r{i}",
            [rng.randrange(vocab) for _ in range(rng.randint(1, max_prompt))],
            rng.randint(1, max_blocks) * block,
        )
        for i in range(n)
    ]
