"""The two layouts of a block-diffusion forward, and how each attends over the paged KV pool.

A row's queries are its committed tokens not yet cached (a newly admitted prompt, or the block committed
last cycle) followed by its active block; it attends over the keys of positions ``[0, end)``, where
``end`` is its active block's end, under a block-causal mask (a query sees its own block and those
before). Both layouts write every query's K/V to the pool first, then read each row's keys back.

- ``DenseBlockForward``: rows padded to the widest row's queries and keys, one SDPA call with a mask
  (static batching's box).
- ``PackedBlockForward``: the rows' queries one after another, no padding. Rows of one ``(end, width)``
  are adjacent and attend in one SDPA call over exactly their keys; a group whose queries are its active
  block alone needs no mask (every key before ``end`` is visible to it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine_pod.models.paged_kv import PagedKVPool


def block_causal(queries: torch.Tensor, keys: torch.Tensor, block_length: int) -> torch.Tensor:
    """[..., Q, K] from query positions [..., Q] and key positions [K]: a query at position p may attend
    the key at position j iff j's block is p's block or an earlier one."""
    return keys // block_length <= queries[..., None] // block_length


def block_causal_mask(first: int, end: int, block_length: int, device) -> torch.Tensor:
    """[end - first, end]: the queries at positions [first, end) over the keys at [0, end)."""
    return block_causal(
        torch.arange(first, end, device=device), torch.arange(end, device=device), block_length
    )


def _expanded(keys: torch.Tensor, heads: int) -> torch.Tensor:
    """[R, K, kv_heads, hd] -> [R, heads, K, hd]: grouped K/V repeated for every query head."""
    keys = keys.transpose(1, 2)
    groups = heads // keys.shape[1]
    return keys.repeat_interleave(groups, dim=1) if groups > 1 else keys


@dataclass
class DenseBlockForward:
    """One batched forward: rows padded to Q queries and K keys."""

    tokens: torch.Tensor  # [R, Q] query token ids (padding: any id)
    positions: torch.Tensor  # [R, Q] absolute positions of the queries
    write_slots: torch.Tensor  # [R, Q] pool slots the queries' K/V go to (padding: the scratch slot)
    key_slots: torch.Tensor  # [R, K] pool slots each row attends over (padding: the scratch slot)
    mask: torch.Tensor  # [R, Q, K] True where the query may attend the key
    pool: PagedKVPool

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q [R, H, Q, hd] (after RoPE) -> [R, Q, H, hd]."""
        keys, values = self.pool.read(layer, self.key_slots)
        heads = q.shape[1]
        out = F.scaled_dot_product_attention(
            q, _expanded(keys, heads), _expanded(values, heads), attn_mask=self.mask[:, None]
        )
        return out.transpose(1, 2)


@dataclass
class AttentionGroup:
    """Adjacent rows of one (end, width): ``rows`` x ``width`` queries from ``offset``."""

    offset: int
    rows: int
    width: int
    key_slots: torch.Tensor  # [rows, end]
    mask: torch.Tensor | None  # [width, end], shared by the rows; None where every key is visible


@dataclass
class PackedBlockForward:
    """One forward of rows packed one after another: N queries in all, no padding."""

    tokens: torch.Tensor  # [1, N]
    positions: torch.Tensor  # [1, N]
    write_slots: torch.Tensor  # [1, N]
    groups: list[AttentionGroup]
    pool: PagedKVPool

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q [1, H, N, hd] (after RoPE) -> [1, N, H, hd]: each group over its own keys."""
        queries = q[0].transpose(0, 1)  # [N, H, hd]
        out = torch.empty_like(queries)
        heads = q.shape[1]
        for group in self.groups:
            span = slice(group.offset, group.offset + group.rows * group.width)
            group_q = queries[span].view(group.rows, group.width, *queries.shape[1:]).transpose(1, 2)
            keys, values = self.pool.read(layer, group.key_slots)
            mask = None if group.mask is None else group.mask[None, None]
            result = F.scaled_dot_product_attention(
                group_q, _expanded(keys, heads), _expanded(values, heads), attn_mask=mask
            )
            out[span] = result.transpose(1, 2).reshape(-1, *queries.shape[1:])
        return out[None]


BlockForward = DenseBlockForward | PackedBlockForward
