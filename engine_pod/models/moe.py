"""LLaDA2.0's mixture-of-experts MLP: sigmoid router with a load-balancing expert bias, group-limited
top-k routing, a routed-weight scale, and shared experts that every token passes through.

Routing follows the published modelling code: scores = sigmoid(router logits); the bias is added only
to choose experts (the best ``groups_per_token`` groups by the sum of their two best biased scores,
then the top-k experts inside them); the chosen experts' unbiased scores are normalised to sum to one
(when k > 1) and scaled. Each token's output depends on that token alone, whatever else is batched.

Inference (``stack_experts``, at load): every expert's projections are views of three stacked tensors and
the routed experts run as three ``grouped_mm`` calls over the tokens sorted by expert, the groups' ends
found on the device: the same ops however many experts the tokens chose, and nothing read back to the
host (float64, which ``grouped_mm`` does not take, and training loop over the experts hit). Under
``--batch-invariant`` (models/batch_invariant.py) the router multiplies through ``row_invariant.linear``
and each expert's group is padded to a multiple of ``row_invariant.TILE_ROWS`` rows, as DiffusionGemma's
experts always are: a token's bits never depend on how many tokens chose its experts.

Expert parallelism (a rank holding some of the experts, ``MoESpec.held``): every rank has every token
already (the attention before the layer ends in the whole hidden state on every rank), so dispatching a
token to its experts' ranks moves nothing: each rank runs its experts over the pairs routed to them, and
one all-reduce combines the ranks' parts (``parallel/block_shards.py`` says why that beats an all-to-all).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine_pod.models.config import ModelConfig, MoESpec
from engine_pod.models.layers import GatedMLP, gate_activation
from engine_pod.models.row_invariant import PaddedGroups, linear, padded_groups

GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


class Router(nn.Module):
    """Chooses each token's experts and their weights."""

    row_invariant = False  # --batch-invariant: the scores through row_invariant.linear

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.empty(spec.num_experts, hidden))
        self.expert_bias = nn.Parameter(torch.zeros(spec.num_experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Experts [N, k] and weights [N, k] (float32, float64 for float64 models)."""
        compute = torch.promote_types(x.dtype, torch.float32)
        product = linear if self.row_invariant else F.linear
        scores = torch.sigmoid(product(x.to(compute), self.weight.to(compute)))
        expert = self._choose(scores + self.expert_bias.to(compute))
        chosen = scores.gather(1, expert)
        if self.spec.experts_per_token > 1:
            chosen = chosen / (chosen.sum(-1, keepdim=True) + 1e-20)
        return expert, chosen * self.spec.routed_scaling

    def _choose(self, biased: torch.Tensor) -> torch.Tensor:
        spec, tokens = self.spec, biased.shape[0]
        grouped = biased.view(tokens, spec.groups, -1)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        best_groups = group_scores.topk(spec.groups_per_token, dim=-1, sorted=False).indices
        allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
        allowed = allowed[:, :, None].expand_as(grouped).reshape(tokens, -1)
        masked = biased.masked_fill(~allowed, float("-inf"))
        return masked.topk(spec.experts_per_token, dim=-1).indices


class MixtureOfExperts(nn.Module):
    """Routed experts plus the shared experts (one MLP of ``shared_experts`` x the expert width).

    In a group, each rank holds some routed experts (``spec.held_experts``: an expert
    parallel rank's set; every one where only the width is split) and computes their part of every token's
    output, zeros for the (token, k) pairs routed to other ranks' experts; one all-reduce sums the ranks'
    parts (``combine``). The shared experts join that sum where they are split over the ranks, and are
    added after it where every rank holds them whole."""

    # sums the ranks' parts (a group's all-reduce; None in one process)
    combine: Callable[[torch.Tensor], torch.Tensor] | None = None
    shared_repeated: bool = False  # every rank holds the shared experts whole: added after the sum

    row_invariant = False  # --batch-invariant: each expert's group padded to a multiple of TILE_ROWS rows

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        spec = config.moe
        self.num_experts = spec.num_experts
        self.held = spec.held_experts
        self.gate = Router(config.hidden_size, spec)
        self.activation = gate_activation(
            config.activation, in_place=True
        )  # the grouped experts' (inference)
        width = spec.expert_intermediate_size
        # keyed by the whole model's expert number: a rank's parameters keep the checkpoint's names
        self.experts = nn.ModuleDict({str(index): GatedMLP(config, width) for index in self.held})
        self.shared_experts = None
        if spec.shared_experts:
            self.shared_experts = GatedMLP(config, spec.shared_width or width * spec.shared_experts)

    def stack_experts(self) -> None:
        """Inference: each projection's weights of every held expert in one [E, out, in] tensor, the
        experts' parameters views of it (no memory duplicated)."""
        stacked = []
        experts = list(self.experts.values())
        for name in PROJECTIONS:
            weights = torch.stack([getattr(expert, name).weight.detach() for expert in experts])
            for index, expert in enumerate(experts):
                getattr(expert, name).weight = nn.Parameter(weights[index], requires_grad=False)
            stacked.append(weights)
        self._stacked = tuple(stacked)

    def _grouped_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """The stacked weights, while the experts' parameters are still their views (a later ``.to()``
        gives them storage of their own) and grouped_mm takes the dtype and widths."""
        stacked = getattr(self, "_stacked", None)
        if stacked is None or torch.is_grad_enabled() or x.dtype not in GROUPED_DTYPES:
            return None
        if self.experts[str(self.held.start)].gate_proj.weight.data_ptr() != stacked[0].data_ptr():
            return None
        aligned = all(w.shape[-1] * w.element_size() % 16 == 0 for w in stacked)
        return stacked if aligned and stacked[0].dtype == x.dtype else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        expert, weight = self.gate(flat)
        out = self._routed(flat, expert, weight)
        shared = self.shared_experts
        if shared is not None and not self.shared_repeated:
            out = out + shared(flat)
        if self.combine is not None:  # the ranks' parts summed
            out = self.combine(out)
        if shared is not None and self.shared_repeated:
            out = out + shared(flat)
        return out.view(shape)

    def _held_keys(self, expert: torch.Tensor) -> torch.Tensor:
        """Each (token, k) pair's key: its expert's place among the held ones (0 to held - 1), the other
        experts after them (held to E - 1): sorted by key, the held experts' pairs come first, grouped."""
        return (expert - self.held.start) % self.num_experts

    def _routed(self, x: torch.Tensor, expert: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """sum over k of weight[:, k] * expert[:, k](x) for x [N, D] over the held experts (zeros for the
        others'): the (token, k) pairs sorted by expert, each expert run once on its tokens, the weighted
        outputs summed over k in the router's precision (in k order, as the reference does)."""
        stacked = self._grouped_weights(x)
        if stacked is not None:
            return self._grouped(x, expert, weight, stacked)
        tokens, k = expert.shape
        keys = self._held_keys(expert).reshape(-1)
        order = keys.argsort(stable=True)
        counts = torch.bincount(keys, minlength=self.num_experts).tolist()[: len(self.held)]
        inputs = x[order // k]
        outputs, start = [], 0
        for index, count in zip(self.held, counts):
            if count:
                outputs.append(self.experts[str(index)](inputs[start : start + count]))
                start += count
        pairs = torch.zeros(tokens * k, x.shape[-1], dtype=weight.dtype, device=x.device)
        if outputs:
            pairs[order[:start]] = torch.cat(outputs).to(weight.dtype)
        return (pairs.view(tokens, k, -1) * weight[..., None]).sum(1).to(x.dtype)

    def _grouped(
        self, x: torch.Tensor, expert: torch.Tensor, weight: torch.Tensor, stacked: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """``_routed`` as three grouped matmuls over every (token, k) pair, the held experts' groups first:
        the same ops and shapes whatever experts the tokens chose (the pairs of other ranks' experts lie
        past the last group, which grouped_mm leaves, and are zeroed)."""
        tokens, k = expert.shape
        keys = self._held_keys(expert).reshape(-1)
        order = keys.argsort(stable=True)
        inputs, rows, held = x[order // k], None, len(self.held)
        if self.row_invariant:
            layout = padded_groups(keys[order], held)
            inputs, rows, ends = self._padded(inputs, layout), layout.rows, layout.ends
        else:
            numbers = torch.arange(1, held + 1, device=x.device, dtype=keys.dtype)
            ends = torch.searchsorted(keys[order], numbers).to(
                torch.int32
            )  # each held expert's group ends here
        gate, up, down = (w.transpose(1, 2) for w in stacked)
        hidden = self.activation(F.grouped_mm(inputs, gate, offs=ends))
        hidden.mul_(F.grouped_mm(inputs, up, offs=ends))
        out = F.grouped_mm(hidden, down, offs=ends)
        out = out if rows is None else out[rows]
        if held < self.num_experts:  # the other ranks' pairs lie past the last group: not computed
            out = torch.where((keys[order] < held)[:, None], out, 0)
        pairs = torch.empty(tokens * k, x.shape[-1], dtype=weight.dtype, device=x.device)
        pairs[order] = out.to(weight.dtype)
        return (pairs.view(tokens, k, -1) * weight[..., None]).sum(1).to(x.dtype)

    def _padded(self, inputs: torch.Tensor, layout: PaddedGroups) -> torch.Tensor:
        """The sorted rows ``inputs`` at their places in the padded groups (zero rows between)."""
        padded = inputs.new_zeros(PaddedGroups.room(inputs.shape[0], len(self.held)), inputs.shape[-1])
        padded[layout.rows] = inputs
        return padded
