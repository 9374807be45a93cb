"""A warm prefix's whole blocks computed into a block-diffusion runner's prefix cache and pinned there
(scheduler/warm_prefixes.py says which models and settings allow it, and why only those)."""

from __future__ import annotations

import torch

from engine_pod.kinds.block_causal.batches import packed_forward
from engine_pod.kinds.block_causal.cycle_layout import BlockRow, lay_out, step_queries

WARM_OWNER = "warm-prefix"  # the pool's owner of the pages a prefix is computed in (released after)


def fill_prefix(stepper, tokens: list[int]) -> int:
    """Compute ``tokens``' whole blocks into ``stepper``'s (a BlockCausalStepper's) prefix cache and pin them
    there: one forward of the prefix and one masked block after it (whose keys are dropped), as a request's
    first forward is.
    Returns the tokens newly pinned (blocks pinned by an earlier prefix are not counted again)."""
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
