"""What share of a token's profiled peak its dual cache holds for the row's whole life (the rest is the
refresh forward's and passes): dLLM-Serve's admission counts the two apart (scheduler/dllm_serve.py)."""

from __future__ import annotations

from engine_pod.families.registry import family_of
from engine_pod.loading.loader import load_metadata, parse_dtype


def cache_share(
    model: str, family: str | None, dtype: str, tensor_parallel: int, bytes_per_token: float
) -> dict:
    """``cache_bytes_per_token`` (a dual-cache family's keys and values of one token, per rank, of
    ``model``) and its ``cache_share`` of the profiled ``bytes_per_token``; nothing for a family without a
    dual cache."""
    config, _ = load_metadata(model, family)
    if not family_of(config).kind.refreshes:
        return {}
    kv_heads = config.num_kv_heads // tensor_parallel if config.num_kv_heads >= tensor_parallel else 1
    cache = 2 * config.num_layers * kv_heads * config.head_dim * parse_dtype(dtype).itemsize
    return {"cache_bytes_per_token": cache, "cache_share": round(min(1.0, cache / bytes_per_token), 4)}
