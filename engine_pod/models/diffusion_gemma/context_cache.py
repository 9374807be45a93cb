"""The causal context's keys and values, kept across canvases: DiffusionGemma's cache layout.

The encoder writes it (the prompt at once, then each committed canvas), the decoder only reads it:
every denoising step of a canvas attends to the same context. Per layer, keys and values are
[rows, kv_heads, kept, head_dim] after k_norm/RoPE and v_norm, as the reference's ``DynamicCache``
holds them: a full-attention layer keeps every context token, a sliding-window layer only the last
``sliding_window - 1`` (all that a later query of the encoder can see, and all that the reference's
decoder sees of the context in those layers). The full layers' heads are wider and fewer than the
sliding layers', so the layers' entries differ in shape.

One cache holds one request's context (its tensors' rows dimension is 1); a batched forward takes one
cache per row, so rows of different context lengths step together (``attention.py``).
"""

from __future__ import annotations

import torch

from engine_pod.models.diffusion_gemma.config import DiffusionGemmaConfig


class ContextCache:
    """Per layer, the context's keys and values; ``length`` context tokens encoded so far."""

    def __init__(self, config: DiffusionGemmaConfig) -> None:
        self.window = config.sliding_window
        self.sliding = [config.is_sliding(layer) for layer in range(config.num_layers)]
        self.keys: list[torch.Tensor | None] = [None] * config.num_layers
        self.values: list[torch.Tensor | None] = [None] * config.num_layers
        self.length = 0  # context tokens encoded: the next token's position

    def kept(self, layer: int) -> int:
        """How many context tokens layer ``layer`` holds (the last ones)."""
        keys = self.keys[layer]
        return 0 if keys is None else keys.shape[2]

    def extend(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new context tokens' keys/values [R, Hkv, T, hd]; returns the held ones followed by
        the new ones (what the encoder's queries attend over), and keeps what later forwards need."""
        if self.keys[layer] is not None:
            keys = torch.cat([self.keys[layer], keys], dim=2)
            values = torch.cat([self.values[layer], values], dim=2)
        if self.sliding[layer]:
            self.keys[layer] = keys[:, :, -self.window + 1 :]
            self.values[layer] = values[:, :, -self.window + 1 :]
        else:
            self.keys[layer], self.values[layer] = keys, values
        return keys, values

    def read(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The context keys/values the decoder attends to in ``layer`` (None before any encoding)."""
        return self.keys[layer], self.values[layer]

    def advance(self, tokens: int) -> None:
        """Record that the encoder has written ``tokens`` more context tokens in every layer."""
        self.length += tokens
