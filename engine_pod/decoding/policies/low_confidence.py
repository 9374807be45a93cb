"""LLaDA low-confidence remasking: commit the top-k most probable candidates, k from the linear schedule."""

from __future__ import annotations

import torch

from engine_pod.decoding.policies.base import StepContext, top_k_per_row
from engine_pod.decoding.policies.schedules import linear_quota
from engine_pod.decoding.scoring import max_probability


class LowConfidencePolicy:
    name = "low_confidence"
    scorer = staticmethod(max_probability)
    quota_schedule = True

    def select(self, confidence: torch.Tensor, candidates: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        quota = linear_quota(ctx.masks_at_block_start, ctx.step, ctx.steps_per_block)
        return top_k_per_row(confidence, candidates, quota)
