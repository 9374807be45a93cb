"""Warm prefixes: fixed token prefixes (a system prompt) computed into the block prefix cache at a worker's
start and pinned there, so that every request that starts with one finds its whole blocks cached.

Exact for block-diffusion models only: a committed block's keys depend on the tokens up to its end and on
nothing after it, so a prefix computed alone has the keys a request starting with it would compute. LLaDA
and Dream attend both ways across the whole sequence: a prefix's keys depend on everything after it (the
answer's masks included), so a cached prefix would be an approximation (Fast-dLLM's prefix cache), and
they are refused (``warm_prefix_problem``). DiffusionGemma keeps no prefix cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine_pod.runner.paged_cycle import PagedCacheStepper

WARM_OWNER = "warm-prefix"  # the pool's owner of the pages a prefix is computed in (released after)


def warm_prefix_problem(family: str, family_cache: str, cache: str, prefix_cache: bool) -> str | None:
    """Why a model and decoding cannot warm prefixes (None: they can), in one line."""
    if family_cache == "dual":
        return (
            f"--warm-prefix is refused for {family}: its attention is bidirectional, so a prefix's keys and "
            "values depend on every token after it and a cached prefix would only approximate them "
            "(Fast-dLLM's prefix cache); exact warm prefixes need a block-diffusion model (LLaDA2.0, SDAR)"
        )
    if family_cache != "paged":
        return f"--warm-prefix needs a block prefix cache, which {family} does not keep"
    if cache == "none" or not prefix_cache:
        return (
            "--warm-prefix needs the block prefix cache: --prefix-cache on and a KV cache (not --cache none)"
        )
    return None


def fill_prefix(stepper: PagedCacheStepper, tokens: list[int]) -> int:
    """Compute ``tokens``' whole blocks into ``stepper``'s prefix cache and pin them there: one forward of
    the prefix and one masked block after it (whose keys are dropped), as a request's first forward is.
    Returns the tokens newly pinned (blocks pinned by an earlier prefix are not counted again)."""
    import torch

    from engine_pod.block_diffusion.batches import packed_forward
    from engine_pod.block_diffusion.cycle_layout import BlockRow, lay_out, step_queries

    cache, pool, L = stepper.prefix_cache, stepper.pool, stepper.decoding.block_length
    whole = list(tokens[: len(tokens) // L * L])
    if cache is None or not whole:
        return 0
    row = BlockRow(WARM_OWNER, whole)
    try:
        cycle = lay_out(
            [row], pool, L, stepper.decoding.steps_per_block, stepper.mask_id, stepper.score_dtype
        )
        index = torch.arange(1, device=pool.device)
        batch, select = packed_forward(step_queries(cycle, [0], index, True, stepper.mask_id), pool)
        with torch.no_grad():
            stepper.model.forward_batch(batch, select)
        cache.extend(WARM_OWNER, whole, len(whole))
        return cache.pin(whole)
    finally:
        cache.detach(WARM_OWNER)
        pool.release(WARM_OWNER)
