"""What a dual-cache cycle records on request: each committed position's top-two gap (``--margins``) and
row 0's forwards with their commits (a trace, compared with the reference's)."""

from __future__ import annotations

import torch

from engine_pod.decoding.scoring import top_two_gap
from engine_pod.kinds.bidirectional.cycle_box import CycleBox


def record_margins(logits, pick_r, pick_k, transfer, index, margins: torch.Tensor) -> None:
    """Keep the top-two gap of the positions ``transfer`` commits (rows ``index`` of ``margins``)."""
    (gaps,) = logits.map_logits(lambda x: (top_two_gap(x),))
    grid = torch.full(transfer.shape, float("inf"), dtype=margins.dtype, device=margins.device)
    grid[pick_r, pick_k] = gaps.to(margins.dtype)
    committed = margins[index]
    margins[index] = torch.where(transfer, grid, committed)


def trace_entry(box: CycleBox, kind: str, block_length: int, commit) -> dict:
    """Row 0's forward of this ``kind`` ("full", "dual", "prefix") and what it committed."""
    positions = box.position_ids[0].gather(0, box.block_slots[0])
    start = int(positions[0])
    offset = 0 if kind == "full" else start
    input_len = block_length if kind == "dual" else int(box.real[0].sum()) - offset
    transfer, proposals = commit.transfer, commit.proposals
    commits = [[int(positions[k]), int(proposals[0, k])] for k in transfer[0].nonzero(as_tuple=True)[0]]
    return {"kind": kind, "offset": offset, "input_len": input_len, "commits": commits}
