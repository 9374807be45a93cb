"""What a remasking policy is: a scorer for candidates and a rule that picks which to commit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine_pod.decoding.scoring import Scorer


@dataclass(frozen=True)
class StepContext:
    """Everything a policy may look at besides the confidences, one entry per row where batched."""

    step: int  # index of this forward within the block (0: the block's first forward)
    steps_per_block: int | torch.Tensor  # S (per row where rows have their own)
    masks_at_block_start: torch.Tensor  # [R] masked positions when the block started
    masks_now: torch.Tensor  # [R] masked positions before this step's commits
    threshold: torch.Tensor  # [R] confidence threshold of each row (threshold policy)
    eps: float  # final timestep of Dream's schedule


class RemaskingPolicy(Protocol):
    name: str
    scorer: Scorer
    quota_schedule: bool  # True: commits follow a per-step quota, so a block takes exactly S steps

    def select(self, confidence: torch.Tensor, candidates: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """[R, L] bool of positions to commit; ``confidence`` is -inf outside ``candidates``."""
        ...


def top_k_per_row(confidence: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Commit the k[r] most confident candidates of every row r (stable order among equals)."""
    order = torch.sort(confidence, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return (ranks < k[:, None]) & candidates
