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
keys and values into the rows' pages, then attends per row; the decoder attends per group of rows whose
context is equally wide in the layer, every group's context read from the pool in one gather per layer
(no mask, no padding, no row sees another's keys).

SDPA is called as the reference calls it (``transformers`` ``sdpa_attention_forward``): no mask and
``is_causal`` where the mask would be plainly causal, ``enable_gqa`` without a mask for heads up to
256 wide, the K/V heads repeated otherwise; so a single request reproduces the reference bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine_pod.models.diffusion_gemma.blocks import UnscaledRMSNorm
from engine_pod.models.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.models.diffusion_gemma.context_cache import ContextBatch, ContextCache
from engine_pod.models.diffusion_gemma.rotary import rotate
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
        """New context tokens x [R, T, D], row r at positions contexts.caches[r].length.. : their keys and
        values go to the row's pages; causal attention over the row's kept context and themselves."""
        q, k, v = self._project(x, cos, sin)
        contexts.write(self.layer, k, v)
        out = [
            self._encode_row(q[r : r + 1], k[r : r + 1], v[r : r + 1], cache)
            for r, cache in enumerate(contexts.caches)
        ]
        return self._output(x, torch.cat(out))

    def _encode_row(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: ContextCache
    ) -> torch.Tensor:
        held = cache.read(self.layer)
        kept = 0 if held is None else held[0].shape[2]
        keys = k if held is None else torch.cat([held[0], k], dim=2)
        values = v if held is None else torch.cat([held[1], v], dim=2)
        tokens, width = q.shape[2], keys.shape[2]
        plain_causal = (tokens == 1 or width == tokens) and (not self.sliding or width < self.window)
        if plain_causal:
            return self._attend(q, keys, values, None, causal=tokens > 1)
        query_pos = torch.arange(kept, kept + tokens, device=q.device)[:, None]
        key_pos = torch.arange(width, device=q.device)[None, :]
        mask = key_pos <= query_pos
        if self.sliding:
            mask &= key_pos > query_pos - self.window
        return self._attend(q, keys, values, mask[None, None], causal=False)

    def decode(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, contexts: ContextBatch
    ) -> torch.Tensor:
        """The canvases x [R, L, D], row r over contexts.caches[r]: bidirectional over the layer's kept
        context and the canvas. Rows whose context is equally wide in this layer attend in one call (every
        row past the window in a sliding layer); no row sees another's keys and no mask is needed."""
        q, k, v = self._project(x, cos, sin)
        out = torch.empty_like(q)
        for index, context_keys, context_values in contexts.context(self.layer):
            keys, values = k.index_select(0, index), v.index_select(0, index)
            if context_keys is not None:
                keys = torch.cat([context_keys, keys], dim=2)
                values = torch.cat([context_values, values], dim=2)
            out[index] = self._attend(q.index_select(0, index), keys, values, None, causal=False)
        return self._output(x, out)

    def _output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """o_proj of the heads' outputs out [R, H, T, hd]."""
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
    ) -> torch.Tensor:
        groups = self.num_heads // self.num_kv_heads
        grouped = groups > 1 and mask is None and self.head_dim <= _GQA_MAX_HEAD_DIM
        if groups > 1 and not grouped:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=1.0, is_causal=causal, enable_gqa=grouped
        )
