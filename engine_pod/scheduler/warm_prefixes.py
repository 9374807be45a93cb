"""Warm prefixes: fixed token prefixes (a system prompt) computed into the block prefix cache at a worker's
start and pinned there, so that every request that starts with one finds its whole blocks cached.

Exact for block-diffusion models only: a committed block's keys depend on the tokens up to its end and on
nothing after it, so a prefix computed alone has the keys a request starting with it would compute. LLaDA
and Dream attend both ways across the whole sequence: a prefix's keys depend on everything after it (the
answer's masks included), so a cached prefix would be an approximation (Fast-dLLM's prefix cache), and
they are refused (``warm_prefix_problem``, torch-free, so that the worker and the command line refuse
before any weights load). DiffusionGemma keeps no prefix cache. kinds/block_causal/warm_prefix.py fills the
cache.
"""

from __future__ import annotations

from dllm_contracts.run_rules import BIDIRECTIONAL_NAME, BLOCK_CAUSAL_NAME


def warm_prefix_problem(family: str, family_kind: str, cache: str, prefix_cache: bool) -> str | None:
    """Why a model and decoding cannot warm prefixes (None: they can), in one line."""
    if family_kind == BIDIRECTIONAL_NAME:
        return (
            f"--warm-prefix is refused for {family}: its attention is bidirectional, so a prefix's keys and "
            "values depend on every token after it and a cached prefix would only approximate them "
            "(Fast-dLLM's prefix cache); exact warm prefixes need a block-diffusion model (LLaDA2.0, SDAR)"
        )
    if family_kind != BLOCK_CAUSAL_NAME:
        return f"--warm-prefix needs a block prefix cache, which {family} does not keep"
    if cache == "none" or not prefix_cache:
        return (
            "--warm-prefix needs the block prefix cache: --prefix-cache on and a KV cache (not --cache none)"
        )
    return None
