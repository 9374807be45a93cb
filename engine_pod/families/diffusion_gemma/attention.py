"""DiffusionGemma's attention: causal in the encoder, bidirectional over context + canvas in the decoder.

Gemma 4's layout: RMSNorm over each head's queries and keys (``q_norm``, ``k_norm``) and, unscaled, over
its values (``v_norm``); attention scale 1 (the norms fix the logits' size); the full-attention layers
have no ``v_proj``: their values are their keys before ``k_norm`` and RoPE (``attention_k_eq_v``).

Encoder: queries of the new context tokens attend causally over the kept context and themselves, a
sliding layer within its window (a query sees itself and the ``sliding_window - 1`` keys before it).
Decoder: the canvas attends with no mask over what the context cache holds of that layer (all of the
context in a full layer, its last ``sliding_window - 1`` tokens in a sliding one) followed by the
canvas itself, whatever the canvas length: the reference's decoder passes no sliding mask.

A batched forward takes its rows' contexts (``ContextBatch``: one context cache per row, in pages of one
pool): the projections, norms and output run over every row at once; the encoder writes the new tokens'
keys and values into the rows' pages; then every row attends over its kept context (read from the pool
in one gather per layer) and its new tokens in one call of the engine's attention op
(models/attention_backends.py), no padding, no row seeing another's keys.

SDPA is called as the reference calls it (``transformers`` ``sdpa_attention_forward``): no mask and
``is_causal`` where the mask would be plainly causal, ``enable_gqa`` without a mask for heads up to
256 wide, the K/V heads repeated otherwise; so a single request reproduces the reference bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from engine_pod.families.diffusion_gemma.blocks import UnscaledRMSNorm
from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.families.diffusion_gemma.context_cache import ContextBatch
from engine_pod.families.diffusion_gemma.rotary import rotate
from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.attention_rules import BIDIRECTIONAL, Masking, SdpaStyle
from engine_pod.models.layers import RMSNorm
from engine_pod.models.row_invariant import RowInvariantLinear

_GQA_MAX_HEAD_DIM = 256  # the reference lets SDPA group the heads only up to this width


class GemmaAttention(nn.Module):
    """One layer's attention, for the encoder (writes the context cache) and the decoder (reads it)."""

    def __init__(self, config: DiffusionGemmaConfig, layer: int) -> None:
        super().__init__()
        hd, kv, bias = config.layer_head_dims[layer], config.layer_kv_heads[layer], config.attention_bias
        self.layer, self.head_dim, self.num_heads, self.num_kv_heads = layer, hd, config.num_heads, kv
        self.sliding = config.is_sliding(layer)
        self.window = config.sliding_window
        self.q_proj = RowInvariantLinear(config.hidden_size, config.num_heads * hd, bias=bias)
        self.k_proj = RowInvariantLinear(config.hidden_size, kv * hd, bias=bias)
        self.v_proj = RowInvariantLinear(config.hidden_size, kv * hd, bias=bias) if self.sliding else None
        self.o_proj = RowInvariantLinear(config.num_heads * hd, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)
        self.v_norm = UnscaledRMSNorm(hd, config.rms_norm_eps)
        # as the reference calls SDPA: scale 1, grouped heads natively up to 256 wide where no mask is given
        self.style = SdpaStyle(scale=1.0, native_gqa=hd <= _GQA_MAX_HEAD_DIM, head_major=True)

    def _project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [R, H, T, hd], k and v [R, Hkv, T, hd] of x [R, T, D]."""
        rows, tokens, _ = x.shape
        q = rotate(self.q_norm(self.q_proj(x).view(rows, tokens, -1, self.head_dim)), cos, sin)
        k = self.k_proj(x).view(rows, tokens, -1, self.head_dim)
        v = k if self.v_proj is None else self.v_proj(x).view(rows, tokens, -1, self.head_dim)
        k = rotate(self.k_norm(k), cos, sin)
        v = self.v_norm(v)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def encode(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, contexts: ContextBatch
    ) -> torch.Tensor:
        """New context tokens x [R, T, D] (or [1, N, D]: rows of any lengths, packed as ``contexts`` packs
        them), row r at positions contexts.caches[r].length.. : their keys and values go to the row's
        pages; causal attention over the row's kept context and themselves."""
        q, k, v = self._project(x, cos, sin)
        contexts.write(self.layer, k, v)
        masking = Masking(causal=True, window=self.window if self.sliding else None)
        return self._output(x, self._attend_rows(q, k, v, contexts, masking))

    def decode(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, contexts: ContextBatch
    ) -> torch.Tensor:
        """The canvases x [R, L, D], row r over contexts.caches[r]: bidirectional over the layer's kept
        context and the canvas, no mask, no row seeing another's keys."""
        q, k, v = self._project(x, cos, sin)
        return self._output(x, self._attend_rows(q, k, v, contexts, BIDIRECTIONAL))

    def _attend_rows(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, contexts: ContextBatch, masking: Masking
    ) -> torch.Tensor:
        """q [R, H, T, hd] over each row's kept context and k/v [R, Hkv, T, hd] (or [1, ., N, hd]: rows of
        any lengths, packed): one attention call."""
        rows, heads, tokens, width = q.shape
        plan, keys, values = contexts.keys_values(self.layer, masking, self.style, k, v)
        out = ragged_attention(q.transpose(1, 2).flatten(0, 1), keys, values, plan)
        return out.view(rows, tokens, heads, width).transpose(1, 2)

    def _output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """o_proj of the heads' outputs out [R, H, T, hd]."""
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))
