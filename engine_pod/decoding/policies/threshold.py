"""Fast-dLLM threshold decoding: commit every candidate at or above the threshold, and always the best."""

from __future__ import annotations

import torch

from engine_pod.decoding.policies.base import StepContext
from engine_pod.decoding.scoring import max_probability


class ThresholdPolicy:
    name = "threshold"
    scorer = staticmethod(max_probability)
    quota_schedule = False

    def select(self, confidence: torch.Tensor, candidates: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        confident = candidates & (confidence >= ctx.threshold[:, None].to(confidence.dtype))
        best = torch.zeros_like(candidates)
        best.scatter_(-1, confidence.argmax(dim=-1, keepdim=True), True)
        return confident | (best & candidates)
