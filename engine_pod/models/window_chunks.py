"""Sliding-window attention over a long row, a chunk of queries at a time: O(queries x window) work.

Under one mask, a row of ``n`` queries within a window of ``w`` keys costs ``n x n`` scores (and SDPA turns
the ``n x n`` boolean mask into an additive one at every layer) where ``n x w`` would do. Here the row's
queries are cut into chunks, each attending only over the keys its window reaches, under a small mask of
its own (``Masking.window_mask``, the rule the whole row's mask is made of).

The chunks are cut on the CPU flash kernel's key blocks (``KEY_BLOCK``: torch's ``cpu_flash_attention``
walks the keys in blocks of 512 from the first, folding each block into a running softmax): a chunk's
queries lie within one block, and its keys run from the start of the block that holds its first query's
window to the end of its queries' block (or of the row). So every block the kernel reads for a chunk is
one it reads for the whole row, with the same keys and the same entries masked, and the blocks it skips
would each have added exactly nothing (every score masked): a chunked row's outputs are the same bits as
the whole row's under one mask, as the tests check in float64 and float32. A chunk reads at most
``KEY_BLOCK + window`` keys rounded up to whole blocks (1,024 for a window of 128), whatever the row's length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine_pod.models.attention_rules import Masking

KEY_BLOCK = 512  # the CPU flash kernel's key block (torch's cpu_flash_attention: kv_split_size)
# rows of at most this many keys attend under one mask (a chunk's keys would be most of the row's)
CHUNKED_ABOVE = 2 * KEY_BLOCK


@dataclass(frozen=True)
class WindowChunk:
    """One SDPA call of a chunked row: queries ``[q_start, q_end)`` of the row's, over its keys
    ``[k_start, k_end)`` under ``mask`` [queries, keys]."""

    q_start: int
    q_end: int
    k_start: int
    k_end: int
    mask: torch.Tensor


def window_chunks(masking: Masking, queries: int, keys: int, device: torch.device) -> tuple[WindowChunk, ...]:
    """The chunks a row of ``queries`` queries (its last key positions) over ``keys`` keys attends in, under
    a sliding window; () where it attends under one mask (no window, or no more than ``CHUNKED_ABOVE``
    keys). Chunks of one shape share their mask."""
    window = masking.window
    if masking.block or not masking.causal or window is None or keys <= CHUNKED_ABOVE:
        return ()
    first = keys - queries  # the first query's key position
    masks: dict[tuple[int, int, int], torch.Tensor] = {}
    chunks = []
    position = first
    while position < keys:
        end = min(keys, (position // KEY_BLOCK + 1) * KEY_BLOCK)
        start = max(0, position - window + 1) // KEY_BLOCK * KEY_BLOCK  # the first key its window reaches
        shape = (position - start, end - position, end - start)
        if shape not in masks:
            masks[shape] = masking.window_mask(*shape, device)
        chunks.append(WindowChunk(position - first, end - first, start, end, masks[shape]))
        position = end
    return tuple(chunks)


def sdpa_by_chunks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunks: tuple[WindowChunk, ...], scale: float | None
) -> torch.Tensor:
    """q [R, H, Tq, hd] over k/v [R, H, Tk, hd] (heads expanded), one SDPA call per chunk -> [R, H, Tq, hd],
    laid out as one SDPA call lays its output out (token-major underneath)."""
    rows, heads, tokens, _ = q.shape
    out = q.new_empty(rows, tokens, heads, v.shape[-1]).transpose(1, 2)
    for chunk in chunks:
        out[:, :, chunk.q_start : chunk.q_end] = F.scaled_dot_product_attention(
            q[:, :, chunk.q_start : chunk.q_end],
            k[:, :, chunk.k_start : chunk.k_end],
            v[:, :, chunk.k_start : chunk.k_end],
            attn_mask=chunk.mask[None, None],
            scale=scale,
        )
    return out
