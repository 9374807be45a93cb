"""Transformer building blocks shared by LLaDA and Dream: RMSNorm, RoPE, attention, the gated MLP."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine_pod.models.config import MLP_ACTIVATIONS, ModelConfig
from engine_pod.models.forward_batch import ForwardBatch
from engine_pod.models.row_invariant import product_of


class RMSNorm(nn.Module):
    """``w * (x * rsqrt(mean(x^2) + eps))`` computed in at least float32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = torch.promote_types(x.dtype, torch.float32)
        if compute == x.dtype and x.device.type != "cpu":  # one fused kernel, the same arithmetic
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        if compute == x.dtype and not (torch.is_grad_enabled() and x.requires_grad):
            return self._in_place(x)
        h = x.to(compute)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def _in_place(self, x: torch.Tensor) -> torch.Tensor:
        """The same bits as ``F.rms_norm`` (x * x is exactly pow(x, 2)), whose CPU kernel is a composite
        of six passes with a slow ``pow``: two temporaries, the second pass in place (measured 650-780 us
        against 850 us for 6784 x 192 floats)."""
        scale = torch.mul(x, x).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        return torch.mul(x, scale).mul_(self.weight)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE at explicit position ids (each row's first real token is position 0)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim
        # a plain attribute, not a buffer: model.to(bfloat16) must not round the frequencies
        self.inv_freq = theta ** (-exponents)
        self._on_device: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def _frequencies(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (device, dtype)
        if key not in self._on_device:
            self._on_device[key] = self.inv_freq.to(device=device, dtype=dtype)
        return self._on_device[key]

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape [rows, 1, tokens, head_dim / 2], in float32 (float64 for float64 models)."""
        compute = torch.promote_types(dtype, torch.float32)
        angles = position_ids.to(compute)[..., None] * self._frequencies(position_ids.device, compute)
        angles = angles[:, None]
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of [rows, heads, tokens, head_dim] by half-width cos/sin, in their precision:
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), written into one output without temporaries. The
    output is stored token-major ([rows, tokens, heads, head_dim], returned as its transposed view), the
    layout the KV cache and the packed attention read, so that neither copies it again."""
    h = x.to(cos.dtype)
    half = h.shape[-1] // 2
    first, second = h[..., :half], h[..., half:]
    if torch.is_grad_enabled() and h.requires_grad:  # training: autograd cannot follow out= writes
        return torch.cat([first * cos - second * sin, second * cos + first * sin], -1).to(x.dtype)
    rows, heads, tokens, width = h.shape
    out = torch.empty(rows, tokens, heads, width, dtype=h.dtype, device=h.device).transpose(1, 2)
    out_first, out_second = out[..., :half], out[..., half:]
    torch.mul(first, cos, out=out_first)
    out_first.addcmul_(second, sin, value=-1)
    torch.mul(second, cos, out=out_second)
    out_second.addcmul_(first, sin)
    return out.to(x.dtype)


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads, through the forward's batch (its KV pool and plan)."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        hd, kv = config.head_dim, config.num_kv_heads
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, kv, hd
        self.q_proj = nn.Linear(config.hidden_size, config.num_heads * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * hd, config.hidden_size, bias=False)

    def fuse_projections(self) -> None:
        """Put the q, k and v weights (and biases) in one storage, each projection's parameter a view of
        it, so that inference runs one matmul for all three: measured on the shipped model, 7 ms for
        4736 positions where three took 16 (a narrow matmul is inefficient on the CPU); the same for one
        row. Memory is not duplicated. Not for training checkpoints (safetensors refuses shared storage)."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.weight.detach() for p in projections])
        bias = torch.cat([p.bias.detach() for p in projections]) if self.q_proj.bias is not None else None
        start = 0
        for projection in projections:
            rows = projection.weight.shape[0]
            projection.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
            if bias is not None:
                projection.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
            start += rows
        self._fused = (weight, bias)

    def _fused_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """q, k, v of every position from the fused weight, while the projections are still its views
        (a later ``.to()`` gives them storage of their own: then the three matmuls run instead), multiplied
        as the projections multiply (``row_invariant.product_of``)."""
        fused = getattr(self, "_fused", None)
        if fused is None or torch.is_grad_enabled() or self.q_proj.weight.data_ptr() != fused[0].data_ptr():
            return None
        sizes = [p.weight.shape[0] for p in (self.q_proj, self.k_proj, self.v_proj)]
        return product_of(self.q_proj)(x, *fused).split(sizes, dim=-1)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        queries: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention output of every position, or of the ``queries`` positions only (a packed batch's
        last layer: keys and values still come from every position)."""
        rows, tokens, _ = x.shape
        fused = self._fused_qkv(x)
        if fused is None:
            k, v = self.k_proj(x), self.v_proj(x)
        else:
            q_all, k, v = fused
        k = apply_rotary(k.view(rows, tokens, self.num_kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        k = k.transpose(1, 2)  # token-major [R, T, Hkv, hd]
        v = v.view(rows, tokens, self.num_kv_heads, self.head_dim)  # token-major
        if queries is not None:
            x, cos, sin = x[:, queries], cos[:, :, queries], sin[:, :, queries]
            q_all = None if fused is None else q_all[:, queries]
        q = self.q_proj(x) if fused is None else q_all
        q = apply_rotary(q.view(*x.shape[:2], self.num_heads, self.head_dim).transpose(1, 2), cos, sin)
        out = batch.attend(self.layer, q, k, v, final=queries is not None)  # token-major [R, Tq, H, hd]
        return self.o_proj(out.reshape(*x.shape[:2], -1))


def gate_activation(name: str, in_place: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation ``name`` of MLP_ACTIVATIONS; ``in_place``: it may write into its input (where torch's
    function can: SiLU and ReLU)."""
    function, options = MLP_ACTIVATIONS[name]
    if in_place and function in ("silu", "relu"):
        options = {**options, "inplace": True}
    return functools.partial(getattr(F, function), **options)


class GatedMLP(nn.Module):
    """``down(act(gate(h)) * up(h))``, ``act`` the config's activation (SwiGLU with SiLU, GeGLU with GELU)."""

    def __init__(self, config: ModelConfig, width: int | None = None) -> None:
        super().__init__()
        width = width or config.intermediate_size  # an expert's width where it is not the dense one
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.activation = gate_activation(config.activation)
        self.activation_in_place = gate_activation(config.activation, in_place=True)  # inference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        if torch.is_grad_enabled() and gate.requires_grad:
            return self.down_proj(self.activation(gate) * self.up_proj(x))
        return self.down_proj(self.activation_in_place(gate).mul_(self.up_proj(x)))


class DecoderBlock(nn.Module):
    """Pre-norm block: residual after attention and after the MLP."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config, layer)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        queries: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every position's output, or only the ``queries`` positions' (see ``Attention.forward``)."""
        attended = self.attn(self.attn_norm(x), cos, sin, batch, queries)
        x = (x if queries is None else x[:, queries]) + attended
        return x + self.mlp(self.mlp_norm(x))
