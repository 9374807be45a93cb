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
from engine_pod.decoding.policies import make_policy
from engine_pod.models.adapter import adapter_for
from engine_pod.models.loader import LoadedModel
from engine_pod.runner.canvas import build_canvas
from engine_pod.scheduler.cycle_row import CycleRow

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
    if loaded.config.block_diffusion:
        confidence = _block_diffusion_confidences(loaded, decoding, prompts[:SAMPLE_ROWS])
    else:
        confidence = _confidences(loaded, decoding, prompts[:SAMPLE_ROWS])
    threshold = float(torch.quantile(confidence.double().cpu(), 1.0 - fraction))
    return {
        "fraction": fraction,
        "threshold": min(max(threshold, 1e-12), 1.0),
        "sampled_positions": int(confidence.numel()),
        "confidence_max": float(confidence.max()),
    }


def _block_diffusion_confidences(loaded: LoadedModel, decoding: DecodingConfig, prompts: list[list[int]]):
    from engine_pod.block_diffusion.runner import BlockDiffusionRunner, BlockRow

    L = decoding.block_length
    pool = loaded.model.new_pool(sum(len(p) // L + 2 for p in prompts), L, loaded.device)
    runner = BlockDiffusionRunner(loaded.model, pool, L, decoding.steps_per_block)
    return runner.first_step_confidences([BlockRow(f"p{i}", list(p)) for i, p in enumerate(prompts)])


def _confidences(loaded: LoadedModel, decoding: DecodingConfig, prompts: list[list[int]]) -> torch.Tensor:
    rows = [CycleRow(tuple(ids)) for ids in prompts]
    L, config = decoding.block_length, loaded.config
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    canvas = build_canvas(rows, L, config.mask_token_id, pad, loaded.device)
    pick_r = torch.arange(len(rows), device=loaded.device).repeat_interleave(L)
    source = canvas.block_slots.reshape(-1) - adapter_for(config).logit_shift
    hidden = loaded.model.forward_full(
        canvas.tokens, canvas.position_ids, canvas.key_mask, None, (pick_r, source)
    )
    _, confidence = hidden.map_logits(make_policy(decoding.remasking).scorer)
    return confidence
