"""What share of a token's profiled peak its dual cache holds for the row's whole life (the rest is the
refresh forward's and passes), and under the head-sparse cache the share of a row's context the cache
keeps: dLLM-Serve's admission counts a row's held cache at their product, its active block whole
(scheduler/dllm_serve.py)."""

from __future__ import annotations

from dllm_contracts.head_sparse_config import HeadSparseConfig
from engine_pod.families.registry import family_of
from engine_pod.loading.loader import load_metadata, parse_dtype


def cache_share(
    model: str,
    family: str | None,
    dtype: str,
    tensor_parallel: int,
    bytes_per_token: float,
    sparse: HeadSparseConfig | None = None,
) -> dict:
    """``cache_bytes_per_token`` (a dual-cache family's dense keys and values of one token, per rank, of
    ``model``), its ``cache_share`` of the profiled ``bytes_per_token``, and ``context_kept_share``, the
    share of a row's context the ``sparse`` cache keeps (1: dense); nothing for a family without a dual
    cache."""
    config, _ = load_metadata(model, family)
    if not family_of(config).kind.refreshes:
        return {}
    kv_heads = config.num_kv_heads // tensor_parallel if config.num_kv_heads >= tensor_parallel else 1
    cache = 2 * config.num_layers * kv_heads * config.head_dim * parse_dtype(dtype).itemsize
    return {
        "cache_bytes_per_token": cache,
        "cache_share": round(min(1.0, cache / bytes_per_token), 4),
        "context_kept_share": round((sparse or HeadSparseConfig()).context_kept_share(kv_heads), 4),
    }
