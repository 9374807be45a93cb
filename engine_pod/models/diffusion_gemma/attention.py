"""DiffusionGemma's attention: causal in the encoder, bidirectional over context + canvas in the decoder.

Gemma 4's layout: RMSNorm over each head's queries and keys (``q_norm``, ``k_norm``) and, unscaled, over
its values (``v_norm``); attention scale 1 (the norms fix the logits' size); the full-attention layers
have no ``v_proj``: their values are their keys before ``k_norm`` and RoPE (``attention_k_eq_v``).

Encoder: queries of the new context tokens attend causally over the kept context and themselves, a
sliding layer within its window (a query sees itself and the ``sliding_window - 1`` keys before it).
Decoder: the canvas attends with no mask over what the context cache holds of that layer (all of the
context in a full layer, its last ``sliding_window - 1`` tokens in a sliding one) followed by the
canvas itself, whatever the canvas length: the reference's decoder passes no sliding mask.

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
from engine_pod.models.diffusion_gemma.context_cache import ContextCache
from engine_pod.models.diffusion_gemma.rotary import rotate
from engine_pod.models.layers import RMSNorm

_GQA_MAX_HEAD_DIM = 256  # the reference lets SDPA group the heads only up to this width


class GemmaAttention(nn.Module):
    """One layer's attention, for the encoder (writes the context cache) and the decoder (reads it)."""

    def __init__(self, config: DiffusionGemmaConfig, layer: int) -> None:
        super().__init__()
        hd, kv, bias = config.layer_head_dims[layer], config.layer_kv_heads[layer], config.attention_bias
        self.layer, self.head_dim, self.num_heads, self.num_kv_heads = layer, hd, config.num_heads, kv
        self.sliding = config.is_sliding(layer)
        self.window = config.sliding_window
        self.q_proj = nn.Linear(config.hidden_size, config.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv * hd, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv * hd, bias=bias) if self.sliding else None
        self.o_proj = nn.Linear(config.num_heads * hd, config.hidden_size, bias=bias)
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
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: ContextCache
    ) -> torch.Tensor:
        """New context tokens x [R, T, D] at positions cache.length.. : causal attention over the kept
        context and themselves; their keys and values join the cache."""
        q, k, v = self._project(x, cos, sin)
        kept = cache.kept(self.layer)
        keys, values = cache.extend(self.layer, k, v)
        tokens, width = q.shape[2], keys.shape[2]
        plain_causal = (tokens == 1 or width == tokens) and (not self.sliding or width < self.window)
        if plain_causal:
            return self._attend(x, q, keys, values, None, causal=tokens > 1)
        query_pos = torch.arange(kept, kept + tokens, device=x.device)[:, None]
        key_pos = torch.arange(width, device=x.device)[None, :]
        mask = key_pos <= query_pos
        if self.sliding:
            mask &= key_pos > query_pos - self.window
        return self._attend(x, q, keys, values, mask[None, None], causal=False)

    def decode(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: ContextCache
    ) -> torch.Tensor:
        """The canvas x [R, L, D]: bidirectional over the layer's cached context and the canvas."""
        q, k, v = self._project(x, cos, sin)
        context_keys, context_values = cache.read(self.layer)
        if context_keys is not None:
            k = torch.cat([context_keys, k], dim=2)
            v = torch.cat([context_values, v], dim=2)
        return self._attend(x, q, k, v, None, causal=False)

    def _attend(
        self,
        x: torch.Tensor,
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
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=1.0, is_causal=causal, enable_gqa=grouped
        )
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))
