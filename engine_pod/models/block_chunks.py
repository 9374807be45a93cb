"""A block-causal row of several blocks of queries over a long prefix, one SDPA call per block of queries.

Under one mask, a row of ``q`` queries (a long prompt computed whole or a chunk at a time, a cycle's committed
block beside its active one) over ``k`` keys costs ``q x k`` scores, the masked ones too, and SDPA turns the
``q x k`` boolean mask into an additive one at every layer, with the grouped K/V heads repeated for every
query head. Yet a block's queries see exactly the keys up to their block's end and none after it: here each
block of queries is one call over those keys, with no mask where the call's keys end there, so a prompt's
scores are about half the square of its length and nothing ``q x k`` is built.

The calls are cut on the blocks of torch's CPU flash kernel (``window_chunks.KEY_BLOCK``): a call's keys run
to the end of the key block that holds its block's last key (or to the row's end), the keys after its block
masked by a mask of one row ``[1, keys]`` that every query shares. The key blocks a call leaves out would
each have added exactly nothing (every score masked), and the key block it ends in is the one the whole
row's call reads, so every product and reduction is one the kernel computes for the whole row under one
mask, on the same shapes and values: the same bits, as the tests check in float32 and float64. A row's
active block alone over its keys (every denoising step) is already such a call.
"""

from __future__ import annotations

import torch

from engine_pod.models.attention_rules import Masking
from engine_pod.models.window_chunks import KEY_BLOCK, WindowChunk


def block_chunks(masking: Masking, queries: int, keys: int, device: torch.device) -> tuple[WindowChunk, ...]:
    """The calls a block-causal row of ``queries`` queries (its last key positions) over ``keys`` keys attends
    in, one per block of queries; () where it attends under one mask (no blocks, its queries within one
    block, or its keys within one key block: nothing to leave out)."""
    L = masking.block
    if not L or queries <= L or keys <= KEY_BLOCK:
        return ()
    first = keys - queries  # the first query's key position
    positions = torch.arange(keys, device=device)
    chunks = []
    position = first
    while position < keys:
        end = min((position // L + 1) * L, keys)  # its block's end: the last key its queries see, and one
        k_end = min(keys, -(-end // KEY_BLOCK) * KEY_BLOCK)  # the end of the key block holding it
        mask = None if k_end == end else (positions[:k_end] < end)[None]
        chunks.append(WindowChunk(position - first, end - first, 0, k_end, mask))
        position = end
    return tuple(chunks)
