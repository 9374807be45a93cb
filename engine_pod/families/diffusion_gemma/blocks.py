"""Gemma's small building blocks beside the engine's shared ones (``models/layers.py``).

The engine's ``RMSNorm`` is Gemma 4's as it is (``w * x * rsqrt(mean(x^2) + eps)``, in float32, the
same bits as the reference's ``x * pow(mean + eps, -0.5) * w``; not Gemma 1-3's ``(1 + w)``). Gemma adds
an RMSNorm without a scale and a GeGLU MLP (tanh-approximated GELU where LLaDA and Dream have SiLU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine_pod.models.layers import RMSNorm
from engine_pod.models.row_invariant import RowInvariantLinear


class UnscaledRMSNorm(RMSNorm):
    """RMSNorm with no learned scale (the reference's ``with_scale=False``): the weight is a constant
    buffer of ones, never loaded nor saved (multiplying by one is exact)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__(size, eps)
        del self.weight
        self.register_buffer("weight", torch.ones(size), persistent=False)


class GeGLU(nn.Module):
    """``down(gelu_tanh(gate(x)) * up(x))``: the dense MLP of every layer and the self-conditioning MLP."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_proj = RowInvariantLinear(hidden, width, bias=False)
        self.up_proj = RowInvariantLinear(hidden, width, bias=False)
        self.down_proj = RowInvariantLinear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))
