"""Sliding-window attention over a long row, a chunk of queries at a time: O(queries x window) work.

Under one mask, a row of ``n`` queries within a window of ``w`` keys costs ``n x n`` scores (and SDPA turns
the ``n x n`` boolean mask into an additive one at every layer) where ``n x w`` would do. Here the row's
queries are cut into chunks, each attending only over the keys its window reaches, under a small mask of
its own (``Masking.window_mask``, the rule the whole row's mask is made of).

The chunks are cut on the blocks of torch's CPU flash kernel (``cpu_flash_attention``), which walks a call's
queries in blocks (``query_block``: 256 queries for a call of at least 768) and, for each, the keys in
blocks of ``KEY_BLOCK`` from the first, folding each key block into a running softmax. A chunk is whole query
blocks of the row's call, enough of them that its own call blocks its queries the same way, and its keys run
from the start of the key block that holds its first query's window to the end of its last query's key block
(or of the row). So every product and reduction the kernel computes for a chunk is one it computes for the
whole row, on the same shapes and values, and the key blocks a chunk leaves out would each have added exactly
nothing (every score masked): a chunked row's outputs are the same bits as the whole row's under one mask, as
the tests check in float64. Within a window of 128, a chunk of 768 queries reads at most 2,048 keys (the last
chunk, which takes the row's remainder, up to 1,535 queries over 2,560 keys), whatever the row's length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine_pod.models.attention_rules import Masking

KEY_BLOCK = 512  # the CPU flash kernel's key block (torch's cpu_flash_attention: kv_split_size)
# (the fewest queries of a call, the kernel's query block for it), widest first (its q_split_size)
QUERY_BLOCKS = ((768, 256), (192, 64), (0, 32))
# rows of at most this many keys attend under one mask: a chunk's keys would be most of the row's (measured,
# one thread, window 128: 1,300 keys cost the same either way, 1,800 keys 1.7x less in chunks)
CHUNKED_ABOVE = 3 * KEY_BLOCK


@dataclass(frozen=True)
class WindowChunk:
    """One SDPA call of a chunked row: queries ``[q_start, q_end)`` of the row's, over its keys
    ``[k_start, k_end)`` under ``mask`` [queries, keys] (a block's queries: [1, keys] that they share, or
    None where they see every key of the call)."""

    q_start: int
    q_end: int
    k_start: int
    k_end: int
    mask: torch.Tensor | None


def query_block(queries: int) -> tuple[int, int]:
    """(the fewest queries a call needs to get the kernel's query block of a call of ``queries``, that block)."""
    return next((least, block) for least, block in QUERY_BLOCKS if queries >= least)


def window_chunks(masking: Masking, queries: int, keys: int, device: torch.device) -> tuple[WindowChunk, ...]:
    """The chunks a row of ``queries`` queries (its last key positions) over ``keys`` keys attends in, under
    a sliding window; () where it attends under one mask (no window, or no more than ``CHUNKED_ABOVE``
    keys). Chunks of one shape share their mask."""
    window = masking.window
    if masking.block or not masking.causal or window is None or keys <= CHUNKED_ABOVE:
        return ()
    least, block = query_block(queries)
    size = max(1, -(-least // block)) * block  # whole query blocks, enough for the kernel to block them alike
    first = keys - queries  # the first query's key position
    cuts = list(range(0, queries, size))
    if len(cuts) > 1 and queries - cuts[-1] < least:
        cuts.pop()  # too few queries left for a call of their own: the last chunk takes them
    masks: dict[tuple[int, int, int], torch.Tensor] = {}
    chunks = []
    for q_start, q_end in zip(cuts, cuts[1:] + [queries]):
        position, end = first + q_start, first + q_end
        k_start = max(0, position - window + 1) // KEY_BLOCK * KEY_BLOCK  # the first key its window reaches
        k_end = min(keys, -(-end // KEY_BLOCK) * KEY_BLOCK)
        shape = (position - k_start, q_end - q_start, k_end - k_start)
        if shape not in masks:
            masks[shape] = masking.window_mask(*shape, device)
        chunks.append(WindowChunk(q_start, q_end, k_start, k_end, masks[shape]))
    return tuple(chunks)


def sdpa_by_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunks: tuple[WindowChunk, ...],
    scale: float | None,
    gqa: bool = False,
) -> torch.Tensor:
    """q [R, H, Tq, hd] over k/v [R, H, Tk, hd] (heads expanded; ``gqa``: grouped [R, Hkv, Tk, hd], SDPA's
    ``enable_gqa``), one SDPA call per chunk -> [R, H, Tq, hd], laid out as one SDPA call lays its output out
    (token-major underneath). A chunk's mask is [queries or 1, keys] (None: every key)."""
    rows, heads, tokens, _ = q.shape
    out = q.new_empty(rows, tokens, heads, v.shape[-1]).transpose(1, 2)
    for chunk in chunks:
        out[:, :, chunk.q_start : chunk.q_end] = F.scaled_dot_product_attention(
            q[:, :, chunk.q_start : chunk.q_end],
            k[:, :, chunk.k_start : chunk.k_end],
            v[:, :, chunk.k_start : chunk.k_end],
            attn_mask=None if chunk.mask is None else chunk.mask[None, None],
            scale=scale,
            enable_gqa=gqa,
        )
    return out
