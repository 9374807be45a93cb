"""LLaDA2.0's threshold decoding: commit every candidate above the threshold when they are at least the
step's quota, else the quota's most confident candidates.

The quota is the linear split of the block length (not of the masks left) over the block's steps, as
the reference ``generate`` computes it, so a block that starts with prompt tokens in it still follows
the schedule of a whole block. A threshold of 1 or more gives the pure step schedule.
"""

from __future__ import annotations

import torch

from engine_pod.decoding.policies.base import StepContext, top_k_per_row
from engine_pod.decoding.policies.schedules import linear_quota
from engine_pod.decoding.scoring import max_probability


class ScheduledThresholdPolicy:
    name = "scheduled_threshold"
    scorer = staticmethod(max_probability)
    quota_schedule = False

    def select(self, confidence: torch.Tensor, candidates: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        block_length = torch.full_like(ctx.masks_now, confidence.shape[-1])
        quota = torch.minimum(linear_quota(block_length, ctx.step, ctx.steps_per_block), ctx.masks_now)
        confident = candidates & (confidence > ctx.threshold[:, None].to(confidence.dtype))
        enough = confident.sum(-1) >= quota
        return torch.where(enough[:, None], confident, top_k_per_row(confidence, candidates, quota))
