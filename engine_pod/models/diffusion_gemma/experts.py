"""DiffusionGemma's mixture of experts (Gemma 4's): a softmax top-k router and GeGLU experts.

Not LLaDA2.0's (``models/moe.py``: sigmoid scores, an expert bias, group-limited choice, shared experts):
here the router reads the layer's input (the residual stream before the feed-forward norms) through an
unscaled RMSNorm, a learned per-dimension ``scale`` and ``hidden_size ** -0.5``; the top-k of the
float32 softmax are renormalised to sum to one and multiplied by a learned ``per_expert_scale``. The
experts are stored as two 3D tensors (``gate_up_proj`` [E, 2W, D], gate rows first; ``down_proj``
[E, D, W]). Each token's output is the sum of its experts' weighted outputs added in increasing expert
order, as the reference's ``index_add_`` loop adds them; it depends on that token alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine_pod.models.diffusion_gemma.blocks import UnscaledRMSNorm
from engine_pod.models.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.models.row_invariant import RowInvariantLinear, linear


class GemmaRouter(nn.Module):
    """Each token's top-k experts and their weights."""

    def __init__(self, config: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.top_k = config.top_k_experts
        self.root_size = config.hidden_size**-0.5
        self.norm = UnscaledRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.proj = RowInvariantLinear(config.hidden_size, config.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(config.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Experts [N, k] (int64) and weights [N, k] (float32) of x [N, D]."""
        scores = self.proj(self.norm(x) * self.scale * self.root_size)
        probabilities = F.softmax(scores, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probabilities, k=self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights * self.per_expert_scale[experts]


class GemmaExperts(nn.Module):
    """The routed experts; ``forward`` runs each chosen expert once over its tokens."""

    def __init__(self, config: DiffusionGemmaConfig) -> None:
        super().__init__()
        width, hidden = config.moe_intermediate_size, config.hidden_size
        self.num_experts = config.num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(config.num_experts, 2 * width, hidden))
        self.down_proj = nn.Parameter(torch.empty(config.num_experts, hidden, width))

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum over k of weights[:, k] * expert[:, k](x) for x [N, D], added in increasing expert order."""
        tokens = x.shape[0]
        order, counts = self._by_expert(experts)
        slot_major = weights.t().reshape(-1)
        outputs, start = [], 0
        for expert, count in enumerate(counts):
            if count:
                chosen = order[start : start + count]
                outputs.append(self._expert(expert, x[chosen % tokens]) * slot_major[chosen, None])
                start += count
        pairs = torch.empty(experts.numel(), x.shape[-1], dtype=x.dtype, device=x.device)
        pairs[order] = torch.cat(outputs).to(x.dtype)
        return self._sum_in_expert_order(pairs.view(-1, tokens, x.shape[-1]).transpose(0, 1), experts)

    def _by_expert(self, experts: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """The (slot, token) pairs, numbered slot * N + token, grouped by expert and in that order
        inside a group (the reference's ``torch.where`` order), and how many each expert has."""
        flat = experts.t().reshape(-1)
        order = flat.argsort(stable=True)
        return order, torch.bincount(flat, minlength=self.num_experts).tolist()

    def _expert(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """The expert over its tokens x [n, D], each token rounded alike however many others chose the
        expert (``row_invariant.linear``)."""
        gate, up = linear(x, self.gate_up_proj[expert]).chunk(2, dim=-1)
        return linear(F.gelu(gate, approximate="tanh") * up, self.down_proj[expert])

    @staticmethod
    def _sum_in_expert_order(pairs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """pairs [N, k, D] summed over k from zero, lowest expert first (the reference's accumulation)."""
        slots = experts.argsort(dim=-1, stable=True)
        ordered = pairs.gather(1, slots[..., None].expand_as(pairs))
        total = torch.zeros_like(ordered[:, 0])
        for slot in range(ordered.shape[1]):
            total = total + ordered[:, slot]
        return total
