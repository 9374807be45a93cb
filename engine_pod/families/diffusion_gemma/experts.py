"""DiffusionGemma's mixture of experts (Gemma 4's): a softmax top-k router and GeGLU experts.

Not LLaDA2.0's (``models/moe.py``: sigmoid scores, an expert bias, group-limited choice, shared experts):
here the router reads the layer's input (the residual stream before the feed-forward norms) through an
unscaled RMSNorm, a learned per-dimension ``scale`` and ``hidden_size ** -0.5``; the top-k of the
float32 softmax are renormalised to sum to one and multiplied by a learned ``per_expert_scale``. The
experts are stored as two 3D tensors (``gate_up_proj`` [E, 2W, D], gate rows first; ``down_proj``
[E, D, W]). Each token's output is the sum of its experts' weighted outputs added in increasing expert
order, as the reference's ``index_add_`` loop adds them; it depends on that token alone.

Inference in float32, bfloat16 or float16 runs the experts as two ``grouped_mm`` calls over the
(token, slot) pairs sorted by expert, each expert's group padded with zero rows to a multiple of
``row_invariant.TILE_ROWS`` (the library multiplies each group as one product, so a token's bits never
depend on a group of a few rows; ``row_invariant`` says why), the groups laid out on the device: the
same ops however many experts were chosen, nothing read back to the host. float64 (which ``grouped_mm``
does not take) loops over the experts chosen.

An expert-parallel rank holds some of the experts (``held``, set by ``shards.py``) and computes
their part of each token's output, zeros for the pairs routed elsewhere (the layer's all-reduce sums the
ranks' parts: ``shards.py``); its grouped matmuls run over every pair, the held experts' groups first and
the other pairs after the last group (not computed, zeroed): the same ops and shapes whatever was chosen.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine_pod.families.diffusion_gemma.blocks import UnscaledRMSNorm
from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.models.row_invariant import PaddedGroups, RowInvariantLinear, linear, padded_groups

GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
    """The routed experts this process holds; ``forward`` runs each chosen expert once over its tokens."""

    def __init__(self, config: DiffusionGemmaConfig, held: range | None = None) -> None:
        super().__init__()
        width, hidden = config.moe_intermediate_size, config.hidden_size
        self.num_experts = config.num_experts
        self.held = range(config.num_experts) if held is None else held  # the whole model's experts held here
        self.gate_up_proj = nn.Parameter(torch.empty(len(self.held), 2 * width, hidden))
        self.down_proj = nn.Parameter(torch.empty(len(self.held), hidden, width))

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum over k of weights[:, k] * expert[:, k](x) for x [N, D] over the held experts (zeros for the
        others'), added in increasing expert order."""
        if self._groups_on_device(x):
            return self._grouped(x, experts, weights)
        tokens = x.shape[0]
        order, counts = self._by_expert(experts)
        slot_major = weights.t().reshape(-1)
        outputs, start = [], 0
        for expert, count in enumerate(counts[: len(self.held)]):
            if count:
                chosen = order[start : start + count]
                outputs.append(self._expert(expert, x[chosen % tokens]) * slot_major[chosen, None])
                start += count
        pairs = torch.zeros(experts.numel(), x.shape[-1], dtype=x.dtype, device=x.device)
        if outputs:
            pairs[order[:start]] = torch.cat(outputs).to(x.dtype)
        return self._sum_in_expert_order(pairs.view(-1, tokens, x.shape[-1]).transpose(0, 1), experts)

    def _groups_on_device(self, x: torch.Tensor) -> bool:
        """Whether grouped_mm takes these inputs (dtype, rows of 16-byte multiples) outside training."""
        if torch.is_grad_enabled() or x.dtype not in GROUPED_DTYPES or self.gate_up_proj.dtype != x.dtype:
            return False
        return all(n * x.element_size() % 16 == 0 for n in (x.shape[-1], self.down_proj.shape[-1]))

    def _held_keys(self, experts: torch.Tensor) -> torch.Tensor:
        """Each pair's expert as its place among the held ones (0 to held - 1), the others after them."""
        return (experts - self.held.start) % self.num_experts

    def _grouped(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``forward`` as two grouped matmuls; each expert's group padded to a multiple of ``TILE_ROWS`` rows."""
        tokens, pairs_count, held = x.shape[0], experts.numel(), len(self.held)
        flat = self._held_keys(experts).t().reshape(-1)  # pair slot * N + token, as _by_expert numbers them
        order = flat.argsort(stable=True)
        chosen = flat[order]
        layout = padded_groups(chosen, held)
        inputs = x.new_zeros(PaddedGroups.room(pairs_count, held), x.shape[-1])
        inputs[layout.rows] = x[order % tokens]
        gate, up = F.grouped_mm(inputs, self.gate_up_proj.transpose(1, 2), offs=layout.ends).chunk(2, dim=-1)
        hidden = F.grouped_mm(
            F.gelu(gate, approximate="tanh") * up, self.down_proj.transpose(1, 2), offs=layout.ends
        )
        slot_major = weights.t().reshape(-1)
        weighted = hidden[layout.rows] * slot_major[order, None]
        if held < self.num_experts:  # the other ranks' pairs lie past the last group: not computed
            weighted = torch.where((chosen < held)[:, None], weighted, 0)
        pairs = torch.empty(pairs_count, x.shape[-1], dtype=x.dtype, device=x.device)
        pairs[order] = weighted.to(x.dtype)
        return self._sum_in_expert_order(pairs.view(-1, tokens, x.shape[-1]).transpose(0, 1), experts)

    def _by_expert(self, experts: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """The (slot, token) pairs, numbered slot * N + token, grouped by held expert (the others after
        them) and in that order inside a group (the reference's ``torch.where`` order), and how many each
        expert has, in that order."""
        flat = self._held_keys(experts).t().reshape(-1)
        order = flat.argsort(stable=True)
        return order, torch.bincount(flat, minlength=self.num_experts).tolist()

    def _expert(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """Held expert ``expert`` (its place among the held ones) over its tokens x [n, D], each token
        rounded alike however many others chose the expert (``row_invariant.linear``)."""
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
