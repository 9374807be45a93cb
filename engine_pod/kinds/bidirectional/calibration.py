"""What a threshold calibration samples of a dual-cache model: the policy's confidences over each prompt's
first block, from one full forward (kinds/bidirectional/stepper.py's ``first_block_confidences``)."""

from __future__ import annotations

import torch

from engine_pod.kinds.bidirectional.cycle_box import build_box
from engine_pod.models.forward_batch import ForwardBatch
from engine_pod.scheduler.cycle_row import CycleRow


@torch.no_grad()
def first_block_confidences(stepper, prompts: list[list[int]]) -> torch.Tensor:
    """``stepper``: a BidirectionalStepper (its model, policy, quirks and device buffers)."""
    rows = [CycleRow(tuple(ids)) for ids in prompts]
    L, device = stepper.decoding.block_length, stepper.loaded.device
    box = build_box(rows, L, stepper.mask_id, stepper.pad_id, device, buffers=stepper.buffers)
    pick_r = torch.arange(len(rows), device=device).repeat_interleave(L)
    source = box.block_slots.reshape(-1) - stepper.quirks.logit_shift
    batch = ForwardBatch.box_over_itself(box.tokens, box.position_ids, box.key_mask)
    hidden = stepper.model.forward_batch(batch, (pick_r, source))
    _, confidence = hidden.map_logits(stepper.policy.scorer, (0,))
    return confidence
