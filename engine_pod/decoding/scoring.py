"""Turn candidate logits into a proposed token and a confidence score per candidate position.

Scores are computed in float32 (float64 for float64 models), as the reference samplers do.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Scorer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _probabilities(logits: torch.Tensor) -> torch.Tensor:
    compute = torch.promote_types(logits.dtype, torch.float32)
    return torch.softmax(logits.to(compute), dim=-1)


def max_probability(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Proposal = argmax; confidence = its probability."""
    confidence, proposal = _probabilities(logits).max(dim=-1)
    return proposal, confidence


def top_margin(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Proposal = argmax; confidence = top-1 minus top-2 probability."""
    probs = _probabilities(logits)
    top = probs.topk(2, dim=-1).values
    return probs.argmax(dim=-1), top[..., 0] - top[..., 1]


def negative_entropy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Proposal = argmax; confidence = sum p log(p + 1e-10) (higher is more certain)."""
    probs = _probabilities(logits)
    return probs.argmax(dim=-1), (probs * torch.log(probs + 1e-10)).sum(dim=-1)


def top_two_gap(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 probability: how close a position's argmax is to flipping."""
    top = _probabilities(logits).topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]
