"""The two layouts of a block-diffusion forward, and how each attends over the paged KV pool.

A row's queries are its committed tokens not yet cached (a newly admitted prompt, or the block committed
last cycle) followed by its active block; it attends over the keys of positions ``[0, end)``, where
``end`` is its active block's end, under a block-causal mask (a query sees its own block and those
before). Both layouts write every query's K/V to the pool first, then read each row's keys back.

- ``DenseBlockForward``: rows padded to the widest row's queries and keys, one SDPA call with a mask
  (static batching's box).
- ``PackedBlockForward``: the rows' queries one after another, no padding, and their keys read from the
  pool in the same order; every layer attends in one call (models/attention_backends.py) over a plan
  built once per forward (models/ragged.py: rows of one ``(end, width)`` adjacent, a row whose queries
  are its active block alone needs no mask, every key before ``end`` being visible to it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.paged_kv import PagedKVPool
from engine_pod.models.ragged import RaggedAttention


def block_causal(queries: torch.Tensor, keys: torch.Tensor, block_length: int) -> torch.Tensor:
    """[..., Q, K] from query positions [..., Q] and key positions [K]: a query at position p may attend
    the key at position j iff j's block is p's block or an earlier one."""
    return keys // block_length <= queries[..., None] // block_length


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
class PackedBlockForward:
    """One forward of rows packed one after another: N queries in all, no padding."""

    tokens: torch.Tensor  # [1, N]
    positions: torch.Tensor  # [1, N]
    write_slots: torch.Tensor  # [1, N]
    key_slots: torch.Tensor  # [K] each row's key slots, rows one after another in the queries' order
    plan: RaggedAttention  # each row's queries over its keys, block-causal
    pool: PagedKVPool

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q [1, H, N, hd] (after RoPE) -> [1, N, H, hd]: every row over its own keys, in one call."""
        keys, values = self.pool.read(layer, self.key_slots)
        return ragged_attention(q[0].transpose(0, 1), keys, values, self.plan)[None]


BlockForward = DenseBlockForward | PackedBlockForward
