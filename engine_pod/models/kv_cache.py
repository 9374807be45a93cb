"""The per-block-cycle KV cache, owned by the model runner and passed into the model.

Keys are stored after RoPE, token-major: ``[rows, slots, kv_heads, head_dim]``. The last slot is a
scratch slot that is never attended to: window entries that do not belong to a row (padding of a
ragged window) are written there, so every scatter has a harmless destination.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LayerKV:
    keys: torch.Tensor  # [rows, slots + 1, kv_heads, head_dim], RoPE already applied
    values: torch.Tensor  # same shape as keys


class KVCache:
    """Keys and values of every canvas slot, for every layer, rebuilt at each block start."""

    def __init__(self, num_layers: int) -> None:
        self.layers: list[LayerKV | None] = [None] * num_layers
        self.key_mask: torch.Tensor | None = None  # [rows, slots + 1] True where a key may be attended

    @property
    def num_slots(self) -> int:
        """Real slots per row (the scratch slot excluded)."""
        first = self.layers[0]
        return 0 if first is None else first.keys.shape[1] - 1

    def store(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keep the K/V of a full-canvas forward, adding the scratch slot."""
        pad = keys.new_zeros(keys.shape[0], 1, *keys.shape[2:])
        self.layers[layer] = LayerKV(torch.cat([keys, pad], 1), torch.cat([values, pad], 1))

    def scatter(
        self, layer: int, rows: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Write fresh K/V of a window in place, only at ``slots`` of the given ``rows``."""
        kv = self._layer(layer)
        row_index = rows[:, None].expand_as(slots)
        kv.keys[row_index, slots] = keys
        kv.values[row_index, slots] = values

    def gather_rows(self, layer: int, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of the given rows (all rows when ``rows`` is None)."""
        kv = self._layer(layer)
        if rows is None:
            return kv.keys, kv.values
        return kv.keys.index_select(0, rows), kv.values.index_select(0, rows)

    def set_key_mask(self, key_mask: torch.Tensor) -> None:
        scratch = key_mask.new_zeros(key_mask.shape[0], 1)
        self.key_mask = torch.cat([key_mask, scratch], 1)

    def keys_mask_for(self, rows: torch.Tensor | None) -> torch.Tensor:
        if self.key_mask is None:
            raise RuntimeError("the KV cache has no key mask: run a full forward first")
        return self.key_mask if rows is None else self.key_mask.index_select(0, rows)

    def nbytes(self) -> int:
        return sum(kv.keys.nbytes + kv.values.nbytes for kv in self.layers if kv is not None)

    def _layer(self, layer: int) -> LayerKV:
        kv = self.layers[layer]
        if kv is None:
            raise RuntimeError(f"the KV cache has no entries for layer {layer}: run a full forward first")
        return kv
