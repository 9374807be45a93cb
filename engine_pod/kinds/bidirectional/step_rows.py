"""What a dual-cache step knows of its rows: those taking part in its forward, and the host's copy of
their state from the step's one read (stepper.py, phase_stepper.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepRows:
    """The rows taking part in one forward and what they may commit."""

    index: torch.Tensor  # [R'] row numbers in the box
    all_rows: bool  # index covers every row in order (lets the cache skip a gather)
    block: torch.Tensor  # [R', L] current block tokens
    candidates: torch.Tensor  # [R', L] masked positions that may be committed now
    members: list[int]  # index, on the host
    counts: list[int]  # candidates of each of those rows, on the host
    first_masked: list[bool]  # whether each of those rows' blocks starts with a mask


@dataclass(frozen=True)
class HostState:
    """What the host reads of the batch once per step: each row's done flag, its block's masked positions
    and whether its block starts with a mask."""

    done: list[bool]
    masked: list[int]
    first_masked: list[bool]
