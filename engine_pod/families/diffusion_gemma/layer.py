"""One DiffusionGemma layer (Gemma 4's MoE layer), shared by the encoder and the decoder.

Sandwich norms: the attention's output is normalised before the residual add; the feed-forward part is
a dense GeGLU MLP and the mixture of experts side by side on the same residual stream (the MLP after
``pre_feedforward_layernorm``, the experts after ``pre_feedforward_layernorm_2``, routed on the
un-normalised stream), each output normalised, their sum normalised again before the residual add.
The layer's output is scaled by a per-layer scalar, which the encoder and the decoder hold apart
(``layer_scalar`` is a buffer, which the reference does not tie).
"""

from __future__ import annotations

import torch
from torch import nn

from engine_pod.families.diffusion_gemma.attention import GemmaAttention
from engine_pod.families.diffusion_gemma.blocks import GeGLU
from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.families.diffusion_gemma.experts import GemmaExperts, GemmaRouter
from engine_pod.models.forward_batch import ForwardBatch
from engine_pod.models.layers import RMSNorm

LAYER_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "post_feedforward_layernorm_1",
    "post_feedforward_layernorm_2",
    "pre_feedforward_layernorm_2",
)


class GemmaLayer(nn.Module):
    """Attention, then the dense MLP beside the experts; the weights of one layer index."""

    def __init__(self, config: DiffusionGemmaConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(config, layer)
        self.mlp = GeGLU(config.hidden_size, config.intermediate_size)
        self.router = GemmaRouter(config)
        self.experts = GemmaExperts(config)
        for name in LAYER_NORMS:
            setattr(self, name, RMSNorm(config.hidden_size, config.rms_norm_eps))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        scalar: torch.Tensor,
        encoding: bool,
    ) -> torch.Tensor:
        """x [R, T, D], row r a request's: new context tokens (``encoding``: causal, written to row r's
        context through ``batch``) or a canvas (bidirectional, reading it); ``scalar`` is this layer's
        encoder or decoder scalar."""
        attend = self.self_attn.encode if encoding else self.self_attn.decode
        x = x + self.post_attention_layernorm(attend(self.input_layernorm(x), cos, sin, batch))
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        flat = x.reshape(-1, x.shape[-1])
        experts, weights = self.router(flat)
        routed = self.experts(self.pre_feedforward_layernorm_2(flat), experts, weights)
        routed = self.post_feedforward_layernorm_2(routed.reshape(x.shape))
        x = x + self.post_feedforward_layernorm(dense + routed)
        return x * scalar

    def write_context(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> None:
        """The encoder's last layer: its new context tokens' keys and values written, nothing more (its
        output would be the encoder's hidden states, which nothing reads)."""
        self.self_attn.write_context(self.input_layernorm(x), cos, sin, batch)
