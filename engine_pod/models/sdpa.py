"""Masked SDPA over grouped K/V heads, the reference kernel's building block (models/ragged.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Bidirectional attention of q [R,H,Tq,hd] over k/v [R,Hkv,Tk,hd]; key_mask [R,Tk] bool, or None
    where every key may be attended. One SDPA call: on the CPU its flash kernel takes the mask and
    works block by block (measured: 17 MiB above the inputs where 8 x 6 x 2048^2 scores would be 768 MiB,
    float32, float64 and bfloat16), so memory stays linear in the batch's tokens without chunking.

    Grouped-query K/V are expanded to one head per query head first: SDPA's
    ``enable_gqa`` together with a mask leaves only the math kernel on CUDA (its score matrix grows with
    the square of the box width), while expanded heads keep the memory-efficient kernel, whose memory
    is linear in the width. The expansion costs keys x query heads, also linear.

    On the CPU with no mask the grouped heads go in as they are (``enable_gqa``): the same bits as the
    expanded heads (its flash kernel reads each query head's K/V head in place), without copying every key
    and value once per query head at every forward, which a long context's rows paid more for than for
    their attention (measured: a 12,000-token row's decoding forward on LLaDA2.0's tiny preset)."""
    heads = q.shape[1]
    if key_mask is None and q.device.type == "cpu" and heads != k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    return F.scaled_dot_product_attention(q, expand_heads(k, heads), expand_heads(v, heads), attn_mask=mask)


def expand_heads(keys: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped keys or values [R, Hkv, T, hd] repeated for each of ``heads`` query heads."""
    groups = heads // keys.shape[1]
    return keys.repeat_interleave(groups, dim=1) if groups > 1 else keys
