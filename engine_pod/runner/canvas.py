"""Mixed-state dense layout of a block cycle: left padding, position ids, active-block slots.

Every row is right-aligned in a box of width W (left padding), so its first real token gets
position 0 through a cumulative sum over the real-token mask. Each row's active block sits at its
own offset (rows differ in suffix length); ``block_slots`` records it for gather/scatter. Column W
is a scratch slot: window entries that do not belong to a row point there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.scheduler.cycle_row import CycleRow


@dataclass
class Canvas:
    tokens: torch.Tensor  # [R, W] token ids, padding included
    real: torch.Tensor  # [R, W] True where a token belongs to the row (prompt, blocks, suffix)
    key_mask: torch.Tensor  # [R, W] True where attention may look (real and not a hidden suffix)
    context: torch.Tensor  # [R, W] True on the prompt, the committed blocks and the active block
    position_ids: torch.Tensor  # [R, W] logical positions, 0 at each row's first real token
    block_slots: torch.Tensor  # [R, L] columns of each row's active block
    active: torch.Tensor  # [R] rows whose commits count
    thresholds: torch.Tensor  # [R] confidence threshold of each row
    block_length: int

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def block_tokens(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        slots = self.block_slots if rows is None else self.block_slots[rows]
        tokens = self.tokens if rows is None else self.tokens[rows]
        return tokens.gather(1, slots)

    def write_block(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        self.tokens[rows[:, None], self.block_slots[rows]] = values

    def prefix_window(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots [R, Wmax] from each row's block start to the row's end; invalid entries -> scratch."""
        starts = self.block_slots[:, 0]
        lengths = self.width - starts
        offsets = torch.arange(int(lengths.max()), device=starts.device)
        slots = starts[:, None] + offsets[None, :]
        valid = offsets[None, :] < lengths[:, None]
        return torch.where(valid, slots, torch.full_like(slots, self.width)), valid


def _row_tokens(row: CycleRow, block_length: int, mask_id: int) -> list[int]:
    masked = block_length * (1 + row.suffix_blocks)
    return list(row.prefix_ids) + [mask_id] * masked


def build_canvas(
    rows: list[CycleRow],
    block_length: int,
    mask_id: int,
    pad_id: int,
    device: torch.device,
    threshold: float = 0.9,
) -> Canvas:
    """Left-pad every row to the widest one and compute positions, masks and block slots."""
    contents = [_row_tokens(row, block_length, mask_id) for row in rows]
    width = max(len(c) for c in contents)
    tokens = torch.tensor([[pad_id] * (width - len(c)) + c for c in contents], dtype=torch.long)
    lengths = torch.tensor([len(c) for c in contents])
    columns = torch.arange(width)
    real = columns[None, :] >= (width - lengths)[:, None]
    block_start = torch.tensor([width - len(c) + row.width for c, row in zip(contents, rows)])
    block_end = block_start + block_length
    hidden_suffix = torch.tensor([not row.suffix_visible for row in rows])
    visible = ~(hidden_suffix[:, None] & (columns[None, :] >= block_end[:, None]))
    positions = (real.long().cumsum(1) - 1).clamp(min=0)
    slots = block_start[:, None] + torch.arange(block_length)[None, :]
    active = torch.tensor([row.active for row in rows])
    return Canvas(
        tokens=tokens.to(device),
        real=real.to(device),
        key_mask=(real & visible).to(device),
        context=(real & (columns[None, :] < block_end[:, None])).to(device),
        position_ids=positions.to(device),
        block_slots=slots.to(device),
        active=active.to(device),
        thresholds=torch.tensor(
            [threshold if r.threshold is None else r.threshold for r in rows], dtype=torch.float64
        ).to(device),
        block_length=block_length,
    )
