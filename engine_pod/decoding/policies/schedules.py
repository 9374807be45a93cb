"""How many tokens a quota policy commits at a step: LLaDA's linear split and Dream's timestep rule."""

from __future__ import annotations

import torch


def linear_quota(masks_at_block_start: torch.Tensor, step: int, steps_per_block: int) -> torch.Tensor:
    """LLaDA: M masks spread evenly over S steps, the first M mod S steps taking one more."""
    base = torch.div(masks_at_block_start, steps_per_block, rounding_mode="floor")
    remainder = masks_at_block_start - base * steps_per_block
    return base + (step < remainder).to(base.dtype)


def timestep_quota(masks_now: torch.Tensor, step: int, steps_per_block: int, eps: float) -> torch.Tensor:
    """Dream: int(n * (1 - t[i+1] / t[i])) over t = linspace(1, eps, S+1) in float32; the last step takes all."""
    if step >= steps_per_block - 1:
        return masks_now.clone()
    timesteps = torch.linspace(1, eps, steps_per_block + 1, dtype=torch.float32)
    t, s = timesteps[step], timesteps[step + 1]
    fraction = 1 - s / t  # a host scalar: one float32 multiply per row on the device, rounded as on the host
    return (masks_now.to(torch.float32) * fraction).to(torch.int64)
