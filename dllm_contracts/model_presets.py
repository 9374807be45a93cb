"""Architectures of the real checkpoints, for randomly initialised models (``random:NAME``), as data: the
engine builds a model from a preset's config (``engine_pod.loading.presets``); the gateway, torch-free,
reads a preset's EOS ids beside the shipped tokenizer.

A random model of the real shape measures speed and memory exactly as the real one does, without
a download: the benchmark and the profiler need nothing else.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "llada-8b": {
        "model_type": "llada",
        "d_model": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 32,
        "mlp_hidden_size": 12288,
        "embedding_size": 126464,
        "vocab_size": 126464,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
        "mask_token_id": 126336,
        "eos_token_id": 126081,
        "pad_token_id": 126081,
        "max_sequence_length": 4096,
    },
    "dream-7b": {
        "model_type": "Dream",
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "mask_token_id": 151666,
        "eos_token_id": 151643,
        "pad_token_id": 151643,
        "max_position_embeddings": 32768,
    },
    "llada-tiny": {
        "model_type": "llada",
        "d_model": 128,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 4,
        "mlp_hidden_size": 384,
        "embedding_size": 1024,
        "vocab_size": 1024,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-05,
        "mask_token_id": 1000,
        "eos_token_id": 1001,
        "pad_token_id": 1001,
        "max_sequence_length": 4096,
    },
    "dream-tiny": {  # the Dream architecture (q/k/v biases, grouped-query attention) at a CPU benchmark's size
        "model_type": "Dream",
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 384,
        "vocab_size": 1024,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "mask_token_id": 1000,
        "eos_token_id": 1001,
        "pad_token_id": 1001,
        "max_position_embeddings": 4096,
    },
    "llada2-mini": {  # inclusionAI/LLaDA2.0-mini: 16B parameters, 1.4B active per token
        "model_type": "llada2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_hidden_layers": 20,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "partial_rotary_factor": 0.5,
        "use_qk_norm": True,
        "use_qkv_bias": False,
        "use_bias": False,
        "vocab_size": 157184,
        "rope_theta": 600000,
        "rms_norm_eps": 1e-06,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "num_shared_experts": 1,
        "n_group": 8,
        "topk_group": 4,
        "moe_intermediate_size": 512,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 32768,
        "pad_token_id": 156892,
        "eos_token_id": 156892,
        "mask_token_id": 156895,
    },
    "llada2-tiny": {  # the LLaDA2.0 architecture at a size a CPU benchmark runs in minutes
        "model_type": "llada2_moe",
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "partial_rotary_factor": 0.5,
        "use_qk_norm": True,
        "use_bias": False,
        "vocab_size": 1024,
        "rope_theta": 600000,
        "rms_norm_eps": 1e-06,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "num_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "moe_intermediate_size": 64,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 32768,  # LLaDA2.0-mini's context
        "pad_token_id": 1001,
        "eos_token_id": 1001,
        "mask_token_id": 1000,
    },
    "sdar-tiny": {  # the SDAR architecture (Qwen3's: per-head q/k norms, full RoPE) at a CPU benchmark's size
        "model_type": "sdar",
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1024,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "max_position_embeddings": 4096,
        "pad_token_id": 1001,
        "eos_token_id": 1001,
        "mask_token_id": 1000,
    },
    # DiffusionGemma (google/diffusiongemma-26B-A4B-it's layout: sliding layers and a full one with wider
    # heads and one KV head, a dense MLP beside the experts) at a size a CPU benchmark runs in minutes
    "diffusion-gemma-tiny": {
        "model_type": "diffusion_gemma",
        "canvas_length": 32,
        "tie_word_embeddings": True,
        "text_config": {
            "vocab_size": 1024,
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "per_layer_config": {"3": {"head_dim": 64, "num_key_value_heads": 1}},
            "sliding_window": 128,
            "num_experts": 8,
            "top_k_experts": 2,
            "moe_intermediate_size": 64,
            "final_logit_softcapping": 30.0,
            "max_position_embeddings": 8192,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
        },
    },
}


# A preset's generation_config.json, as a checkpoint ships one: DiffusionGemma's sampler settings under
# which its random weights (``diffusion_gemma/random_init.py``) settle. A random model is unsure of every
# token at the reference's default temperatures (0.4 to 0.8: mean entropy near 5 nats, where adaptive
# stopping asks for 0.005). At the temperatures of the reference's own settling runs (0.05 to 0.1), with
# every position accepted at every step, a canvas's argmax settles; stopping on confidence alone (mean
# entropy below 1 nat, no stable run asked for) stops the tiny preset's canvases (seed 0) after 4 to 24
# steps of 32, about 11 on average, each at its own step.
GENERATION_CONFIGS: dict[str, dict[str, Any]] = {
    "diffusion-gemma-tiny": {
        "t_min": 0.05,
        "t_max": 0.1,
        "sampler_config": {"entropy_bound": 1000.0},
        "stability_threshold": 0,
        "confidence_threshold": 1.0,
    },
}


# llada-tiny's layers under LLaDA-8B's vocabulary and special tokens: the LM head's logits dominate
PRESETS["llada-tiny-8b-vocab"] = PRESETS["llada-tiny"] | {
    key: PRESETS["llada-8b"][key]
    for key in ("embedding_size", "vocab_size", "mask_token_id", "eos_token_id", "pad_token_id")
}


def preset(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"unknown random-model preset {name!r}; choose one of {sorted(PRESETS)}")
    return dict(PRESETS[name])
