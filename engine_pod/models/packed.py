"""Packed execution: the rows of a batch concatenated with no padding, and the KV cache stored packed.

Every token-wise operation (embedding, norms, projections, MLP, LM head) runs on ``[1, N, D]`` where N
is the number of positions that exist: each row's prompt, committed blocks and active block (and a
suffix only where attention sees it). Attention runs per row over that row's own keys, one call per
layer (models/ragged.py, models/attention_backends.py). The KV cache of a block cycle holds the N positions of its refresh forward, one
row after another; window forwards write their fresh keys at their rows' own cache positions and
attend over each row's span.
"""

from __future__ import annotations

import torch

from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.ragged import RaggedAttention, RowSpans, starts_of


class PackedKVCache:
    """Keys and values ``[N, kv_heads, head_dim]`` per layer (RoPE applied), rows one after another."""

    def __init__(self, num_layers: int) -> None:
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self.row_start: list[int] = []  # where each canvas row's keys start
        self.row_len: list[int] = []  # how many keys each canvas row has
        self.slot_of: torch.Tensor | None = None  # [R, W + 1] canvas column -> cache position (N: none)
        self.total = 0  # N: positions cached
        self.row_start_on_device: torch.Tensor | None = None  # row_start, [R] on the device
        self.row_len_on_device: torch.Tensor | None = None  # row_len, [R] on the device

    def set_layout(
        self,
        slot_of: torch.Tensor,
        row_start: list[int],
        row_len: list[int],
        row_start_on_device: torch.Tensor,
        row_len_on_device: torch.Tensor,
    ) -> None:
        self.slot_of, self.row_start, self.row_len = slot_of, row_start, row_len
        self.row_start_on_device, self.row_len_on_device = row_start_on_device, row_len_on_device
        self.total = sum(row_len)

    def store(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.layers[layer] = (keys.contiguous(), values.contiguous())

    def scatter(self, layer: int, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
        """Write a window's fresh K/V at its cache ``positions``; the layer's K/V after the write."""
        stored = self.layers[layer]
        if stored is None:
            raise RuntimeError(f"the KV cache has no entries for layer {layer}: run a full forward first")
        stored[0][positions] = keys
        stored[1][positions] = values
        return stored

    def nbytes(self) -> int:
        return sum(keys.nbytes + values.nbytes for keys, values in filter(None, self.layers))


class PackedContext:
    """What every layer of one packed forward shares: its attention plan and where its K/V go."""

    def __init__(
        self,
        plan: RaggedAttention,
        final_plan: RaggedAttention,
        cache: PackedKVCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> None:
        self.plan = plan  # every position attends
        self.final_plan = final_plan  # the last layer: only the selected positions attend
        self.cache = cache
        self.positions = positions  # window forwards: cache position of each query; None: a refresh
        self.layer = 0

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, final: bool = False
    ) -> torch.Tensor:
        """q [1, H, Nq, hd], k/v token-major [1, N, Hkv, hd] -> token-major [1, Nq, H, hd]; ``final``:
        the queries are the selected positions only."""
        layer, self.layer = self.layer, self.layer + 1
        q, k, v = q[0].transpose(0, 1), k[0], v[0]
        if self.cache is not None and self.positions is None:
            self.cache.store(layer, k, v)
        elif self.cache is not None:
            k, v = self.cache.scatter(layer, self.positions, k, v)
        return ragged_attention(q, k, v, self.final_plan if final else self.plan)[None]


def selected_spans(spans: RowSpans, selected_per_row: list[int]) -> RowSpans:
    """The last layer's spans: each row's selected positions (consecutive, in row order) over the row's
    keys as before."""
    return RowSpans(starts_of(selected_per_row), list(selected_per_row), spans.k_start, spans.k_len)
