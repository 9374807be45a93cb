"""Architectures of the real checkpoints, for randomly initialised models (``--model random:NAME``).

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
}


def preset(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"unknown random-model preset {name!r}; choose one of {sorted(PRESETS)}")
    return dict(PRESETS[name])
