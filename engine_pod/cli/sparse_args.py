"""The head-sparse cache's command-line flags (``dllm generate``, ``eval``, ``bench``, ``worker``, ``serve``):
defaults and ranges are HeadSparseConfig's (dllm_contracts/head_sparse_config.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dllm_contracts.head_sparse_config import (
    MAX_POOL_KERNEL,
    MAX_SELECTION_DELAY,
    MODES,
    SCORINGS,
    SELECTIONS,
    HeadSparseConfig,
)
from engine_pod.kinds.bidirectional.head_sparse.groups import profile_has_importance

_DEFAULTS = HeadSparseConfig()
SPARSE_FLAGS = {
    "mode": "--sparse-cache",
    "retention": "--retention",
    "minor_retention": "--minor-retention",
    "core_share": "--core-share",
    "minor_share": "--minor-share",
    "consistency": "--sparse-consistency",
    "scoring": "--sparse-scoring",
    "pool_kernel": "--sparse-pool-kernel",
    "selection": "--sparse-selection",
    "selection_delay": "--selection-delay",
}  # HeadSparseConfig's field -> its flag (parsed as the flag's name in snake case)


def add_sparse_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("head-sparse cache (LLaDA, Dream; packed rows, dual cache)")
    group.add_argument(
        "--sparse-cache",
        choices=MODES,
        default=_DEFAULTS.mode,
        help="each attention head keeps part of each row's cached context: uniform (every head keeps "
        "--retention) or head-centric (by importance, see `dllm heads`: core heads whole, regular at "
        f"--retention, minor at --minor-retention) (default: {_DEFAULTS.mode})",
    )
    group.add_argument(
        "--retention",
        type=float,
        default=_DEFAULTS.retention,
        help=f"share of each row's context a regular (or uniform) head keeps, in (0, 1] (default: {_DEFAULTS.retention})",
    )
    group.add_argument(
        "--minor-retention",
        type=float,
        default=_DEFAULTS.minor_retention,
        help=f"head-centric: the least important heads' retention, in (0, 0.2] (default: {_DEFAULTS.minor_retention})",
    )
    group.add_argument(
        "--core-share",
        type=float,
        default=_DEFAULTS.core_share,
        help=f"head-centric: share of each layer's heads kept whole (default: {_DEFAULTS.core_share})",
    )
    group.add_argument(
        "--minor-share",
        type=float,
        default=_DEFAULTS.minor_share,
        help=f"head-centric: share of each layer's heads at the minor retention (default: {_DEFAULTS.minor_share})",
    )
    group.add_argument(
        "--sparse-consistency",
        type=float,
        default=_DEFAULTS.consistency,
        help="cross-step consistency: a head whose new scores have a cosine similarity above this with the "
        "ranking of its request's previous refresh keeps that ranking; 1 turns it off "
        f"(default: {_DEFAULTS.consistency})",
    )
    group.add_argument(
        "--sparse-scoring",
        choices=SCORINGS,
        default=_DEFAULTS.scoring,
        help="what ranks a key at a refresh: probability (the attention probability the block's queries give "
        "it, averaged over them, summed over a K/V head's query heads) or mean-query-logit (the pre-softmax "
        "logit of the block's mean query, the most over a K/V head's query heads, as dLLM-Serve's published "
        f"code) (default: {_DEFAULTS.scoring})",
    )
    group.add_argument(
        "--sparse-pool-kernel",
        type=int,
        default=_DEFAULTS.pool_kernel,
        help="each context position scores the most of the scores within this many positions around it, odd, "
        f"1 to {MAX_POOL_KERNEL}; 1 pools nothing (dLLM-Serve's code: 3) (default: {_DEFAULTS.pool_kernel})",
    )
    group.add_argument(
        "--sparse-selection",
        choices=SELECTIONS,
        default=_DEFAULTS.selection,
        help="per-head: each K/V head keeps its own positions; shared: every head of a layer keeps one set, "
        f"ranked by the scores summed over its heads (default: {_DEFAULTS.selection})",
    )
    group.add_argument(
        "--selection-delay",
        type=int,
        default=_DEFAULTS.selection_delay,
        help="a block's first forwards that compute every position before the one that selects what is kept, "
        f"0 to {MAX_SELECTION_DELAY} (dLLM-Serve's code: 1) (default: {_DEFAULTS.selection_delay})",
    )
    group.add_argument(
        "--head-importance",
        help="head-centric: the JSON file `dllm heads` wrote (default: the --profile's, where `dllm profile` "
        "stored one)",
    )


def sparse_settings(args: argparse.Namespace) -> dict:
    """HeadSparseConfig's fields (the importance aside) as the flags set them."""
    return {field: getattr(args, flag[2:].replace("-", "_")) for field, flag in SPARSE_FLAGS.items()}


def sparse_config(args: argparse.Namespace) -> HeadSparseConfig:
    return HeadSparseConfig(
        **sparse_settings(args), importance=args.head_importance or _profile_importance(args)
    )


def _profile_importance(args: argparse.Namespace) -> str | None:
    """Head-centric without --head-importance: the --profile, where it stores the heads' importance."""
    profile = getattr(args, "profile", None)
    if args.sparse_cache != "head-centric" or not profile or not profile_has_importance(profile):
        return None
    return profile


def sparse_flags(args: argparse.Namespace) -> list[str]:
    """The flags that give a ``dllm worker`` these settings (checked first; nothing when the cache is off;
    the importance file's path made absolute)."""
    config = sparse_config(args)
    if not config.on:
        return []
    flags = [part for field, flag in SPARSE_FLAGS.items() for part in (flag, str(getattr(config, field)))]
    return flags + (
        ["--head-importance", str(Path(config.importance).resolve())] if config.importance else []
    )
