"""A benchmarked policy with a cache of its own: ``dllm-serve:uniform@0.3`` runs dLLM-Serve with the
uniform head-sparse cache at retention 0.3, ``blockserve:dense`` BlockServe with the dense dual cache, so
that one ``dllm bench`` call compares policies and caches side by side at one token budget. A plain
policy name runs with the cache the flags give (``--sparse-cache``, ``--retention``); the other
head-sparse settings (the minor retention, the shares, the importance) are the flags' in every run."""

from __future__ import annotations

from dataclasses import replace

from dllm_contracts.head_sparse_config import MODES, HeadSparseConfig, HeadSparseConfigError
from engine_pod.decoding.config import DecodingConfig

DENSE = "dense"  # the cache name of the dense dual cache (sparse mode "off")


def split_policy(entry: str) -> tuple[str, str | None]:
    """``policy[:cache]`` as (policy, cache or None)."""
    policy, _, cache = entry.partition(":")
    return policy, (cache or None) if ":" in entry else None


def cache_config(cache: str, base: HeadSparseConfig) -> HeadSparseConfig:
    """The head-sparse settings ``cache`` names (``dense``, ``uniform@R``, ``head-centric@R``), the rest
    ``base``'s. Raises ValueError with one line for a cache out of range."""
    if cache == DENSE:
        return replace(base, mode="off")
    mode, _, retention = cache.partition("@")
    if mode not in MODES or mode == "off" or not retention:
        raise ValueError(
            f"cache {cache!r}: name {DENSE}, uniform@R or head-centric@R (R the retention in (0, 1])"
        )
    try:
        value = float(retention)
    except ValueError:
        raise ValueError(f"cache {cache!r}: retention {retention!r} is not a number") from None
    try:
        return replace(base, mode=mode, retention=value)
    except HeadSparseConfigError as exc:
        raise ValueError(f"cache {cache!r}: {exc}") from None


def decoding_for(entry: str, decoding: DecodingConfig) -> DecodingConfig:
    """The decoding the run ``entry`` (``policy[:cache]``) runs with."""
    _, cache = split_policy(entry)
    if cache is None:
        return decoding
    return replace(decoding, sparse=cache_config(cache, decoding.sparse))
