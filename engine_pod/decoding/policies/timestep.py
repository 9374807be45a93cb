"""Dream's quota policies: the timestep schedule with one of three confidence scores.

``entropy`` ranks by negative entropy, ``maskgit_plus`` by top-1 probability and ``topk_margin``
by the gap between the two most probable tokens.
"""

from __future__ import annotations

import torch

from engine_pod.decoding.policies.base import StepContext, top_k_per_row
from engine_pod.decoding.policies.schedules import timestep_quota
from engine_pod.decoding.scoring import Scorer, max_probability, negative_entropy, top_margin


class TimestepPolicy:
    quota_schedule = True

    def __init__(self, name: str, scorer: Scorer) -> None:
        self.name = name
        self.scorer = scorer

    def select(self, confidence: torch.Tensor, candidates: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        quota = timestep_quota(ctx.masks_now, ctx.step, ctx.steps_per_block, ctx.eps)
        return top_k_per_row(confidence, candidates, quota)


def entropy_policy() -> TimestepPolicy:
    return TimestepPolicy("entropy", negative_entropy)


def maskgit_plus_policy() -> TimestepPolicy:
    return TimestepPolicy("maskgit_plus", max_probability)


def topk_margin_policy() -> TimestepPolicy:
    return TimestepPolicy("topk_margin", top_margin)
