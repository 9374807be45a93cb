"""A confidence threshold at which blocks finish early, for models whose confidences carry no meaning.

Randomly initialised weights (``random:llada-8b``) put every top probability near a few times one
over the vocabulary size, so a threshold of 0.9 never fires: every block takes its full step count,
every row finishes together, and continuous batching's early release is never exercised. Calibrating
picks the threshold that a given share of a block's first-forward confidences reach, so that share of
the masked positions commits per step, and rows finish their blocks after different numbers of steps,
as trained models do. A benchmark that calibrates reports the threshold it used.
"""

from __future__ import annotations

import torch

from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import LoadedModel
from engine_pod.runner.factory import make_runner

SAMPLE_ROWS = 8  # prompts whose first block's confidences are sampled


@torch.no_grad()
def calibrate_threshold(
    loaded: LoadedModel, decoding: DecodingConfig, prompts: list[list[int]], fraction: float
) -> dict:
    """The ``1 - fraction`` quantile of the policy's confidences over the first block of a few prompts."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the share of positions to commit per step must be in (0, 1), got {fraction}")
    if not prompts:
        raise ValueError("calibrating a threshold needs at least one prompt")
    sample = prompts[:SAMPLE_ROWS]
    pool = sum(len(p) + 2 * decoding.block_length for p in sample)  # a block-diffusion model's KV pages
    confidence = make_runner(loaded, decoding, pool).first_block_confidences(sample)
    threshold = float(torch.quantile(confidence.double().cpu(), 1.0 - fraction))
    return {
        "fraction": fraction,
        "threshold": min(max(threshold, 1e-12), 1.0),
        "sampled_positions": int(confidence.numel()),
        "confidence_max": float(confidence.max()),
    }
