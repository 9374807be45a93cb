"""DiffusionGemma's attention: causal in the encoder, bidirectional over context + canvas in the decoder.

Gemma 4's layout: RMSNorm over each head's queries and keys (``q_norm``, ``k_norm``) and, unscaled, over
its values (``v_norm``); attention scale 1 (the norms fix the logits' size); the full-attention layers
have no ``v_proj``: their values are their keys before ``k_norm`` and RoPE (``attention_k_eq_v``).

Encoder: queries of the new context tokens attend causally over the kept context and themselves, a
sliding layer within its window (a query sees itself and the ``sliding_window - 1`` keys before it).
Decoder: the canvas attends with no mask over what the context cache holds of that layer (all of the
context in a full layer, its last ``sliding_window - 1`` tokens in a sliding one) followed by the
canvas itself, whatever the canvas length: the reference's decoder passes no sliding mask.

A batched forward attends through its ``ForwardBatch`` (models/forward_batch.py, made of the rows'
contexts by the canvas kind's ``ContextRows``, kinds/canvas/context_cache.py: one context cache per row,
in pages of one pool): the projections, norms and output run over every row at once; ``batch.attend`` writes the encoder's new
keys and values into the rows' pages, then every row attends over its kept context (read from the pool
in one gather per layer) and its new tokens in one call of the engine's attention op
(models/attention_backends.py), no padding, no row seeing another's keys.

SDPA is called as the reference calls it (``transformers`` ``sdpa_attention_forward``, the batch's plans
say how: ``sdpa_style`` in kinds/canvas/context_cache.py): no mask and ``is_causal`` where the mask would
be plainly causal, ``enable_gqa`` without a mask for heads up to 256 wide, the K/V heads repeated otherwise; so a single
request reproduces the reference bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from engine_pod.families.diffusion_gemma.blocks import UnscaledRMSNorm
from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.families.diffusion_gemma.rotary import rotate
from engine_pod.models.forward_batch import ForwardBatch
from engine_pod.models.layers import RMSNorm
from engine_pod.models.row_invariant import RowInvariantLinear


class GemmaAttention(nn.Module):
    """One layer's attention, for the encoder (writes the context cache) and the decoder (reads it)."""

    def __init__(self, config: DiffusionGemmaConfig, layer: int) -> None:
        super().__init__()
        hd, kv, bias = config.layer_head_dims[layer], config.layer_kv_heads[layer], config.attention_bias
        self.layer, self.head_dim, self.num_heads, self.num_kv_heads = layer, hd, config.num_heads, kv
        sliding = config.is_sliding(layer)
        self.q_proj = RowInvariantLinear(config.hidden_size, config.num_heads * hd, bias=bias)
        self.k_proj = RowInvariantLinear(config.hidden_size, kv * hd, bias=bias)
        self.v_proj = RowInvariantLinear(config.hidden_size, kv * hd, bias=bias) if sliding else None
        self.o_proj = RowInvariantLinear(config.num_heads * hd, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)
        self.v_norm = UnscaledRMSNorm(hd, config.rms_norm_eps)

    def _project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [R, H, T, hd], k and v token-major [R, T, Hkv, hd] of x [R, T, D]."""
        rows, tokens, _ = x.shape
        q = rotate(self.q_norm(self.q_proj(x).view(rows, tokens, -1, self.head_dim)), cos, sin)
        k = self.k_proj(x).view(rows, tokens, -1, self.head_dim)
        v = k if self.v_proj is None else self.v_proj(x).view(rows, tokens, -1, self.head_dim)
        k = rotate(self.k_norm(k), cos, sin)
        v = self.v_norm(v)
        return q.transpose(1, 2), k, v

    def encode(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """New context tokens x [R, T, D] (or [1, N, D]: rows of any lengths, packed as ``batch`` packs
        them), each row's positions continuing its context: their keys and values go to the row's pages
        (the batch's write slots); causal attention over the row's kept context and themselves."""
        if batch.write_slots is None:
            raise ValueError("an encoder forward needs slots for its new context tokens, and this has none")
        return self._attend(x, cos, sin, batch)

    def write_context(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> None:
        """The new context tokens' keys and values into the rows' pages, no attention: the encoder's last
        layer, whose output nothing reads (the decoder reads only the context's keys and values)."""
        if batch.write_slots is None or batch.pool is None:
            raise ValueError("an encoder forward needs slots for its new context tokens, and this has none")
        rows, tokens, _ = x.shape
        k = self.k_proj(x).view(rows, tokens, -1, self.head_dim)
        v = k if self.v_proj is None else self.v_proj(x).view(rows, tokens, -1, self.head_dim)
        k = rotate(self.k_norm(k), cos, sin)
        batch.pool.write(self.layer, batch.write_slots, k.flatten(0, 1), self.v_norm(v).flatten(0, 1))

    def decode(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """The canvases x [R, L, D], each row over its context in ``batch``: bidirectional over the layer's
        kept context and the canvas, no mask, no row seeing another's keys."""
        return self._attend(x, cos, sin, batch)

    def _attend(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """o_proj of every row's attention over what ``batch`` lays out for this layer: one attention call."""
        q, k, v = self._project(x, cos, sin)
        out = batch.attend(self.layer, q, k, v)  # token-major [R, T, H, hd]
        return self.o_proj(out.reshape(*x.shape[:2], -1))
