"""A bidirectional cycle's rows in one box: left padding, position ids, active-block slots (its mixed-state
dense layout, which the packed forwards read too).

Every row is right-aligned in a box of width W (left padding), so its first real token gets
position 0 through a cumulative sum over the real-token mask. Each row's active block sits at its
own offset (rows differ in suffix length); ``block_slots`` records it for gather/scatter. Column W
is a scratch slot: window entries that do not belong to a row point there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.decoding.row_sampling import COLUMNS, RowSampling
from engine_pod.device_buffers import DeviceBuffers, Floats
from engine_pod.scheduler.cycle_row import CycleRow


@dataclass
class CycleBox:
    tokens_with_scratch: torch.Tensor  # [R, W + 1] token ids, padding included, pad in scratch column W
    positions_with_scratch: torch.Tensor  # [R, W + 1] position_ids, 0 in scratch column W
    tokens: torch.Tensor  # [R, W] view of the above: token ids, padding included
    real: torch.Tensor  # [R, W] True where a token belongs to the row (prompt, blocks, suffix)
    key_mask: torch.Tensor  # [R, W] True where attention may look (real and not a hidden suffix)
    context: torch.Tensor  # [R, W] True on the prompt, the committed blocks and the active block
    position_ids: torch.Tensor  # [R, W] logical positions, 0 at each row's first real token
    block_slots: torch.Tensor  # [R, L] columns of each row's active block
    active: torch.Tensor  # [R] rows whose commits count
    thresholds: torch.Tensor  # [R] confidence threshold of each row, in the scores' dtype
    block_length: int
    sampling: RowSampling | None = None  # per-row sampling settings; None: every row is greedy
    logprobs: list[int | None] | None = None  # per row: alternatives to record (None: none asked)
    packed: bool = False  # forwards compute only the positions that exist (packing.py)
    host: BoxRows | None = None  # what the host knows of each row without reading the device
    extra: torch.Tensor | None = None  # [R, E] the caller's per-row integers, sent in the box's copy

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


@dataclass(frozen=True)
class BoxRows:
    """Per row, from the scheduler's rows: what attention sees, the row's context, whether it commits."""

    key_lengths: list[int]  # positions attention sees (prompt, blocks so far, active block, visible suffix)
    context_lengths: list[int]  # the prompt, the committed blocks and the active block
    active: list[bool]

    @classmethod
    def of(cls, rows: list[CycleRow], block_length: int) -> BoxRows:
        context = [row.width + block_length for row in rows]
        suffix = [row.suffix_blocks * block_length if row.suffix_visible else 0 for row in rows]
        return cls([c + s for c, s in zip(context, suffix)], context, [row.active for row in rows])


def _row_tokens(row: CycleRow, block_length: int, mask_id: int, block: list[int] | None) -> list[int]:
    """The row's prefix, its active block (``block``: as far as it was committed, else masked) and suffix."""
    active = [mask_id] * block_length if block is None else list(block)
    return list(row.prefix_ids) + active + [mask_id] * (block_length * row.suffix_blocks)


def box_regions(tokens: int, block_length: int, extra_columns: int = 0) -> dict[str, int]:
    """The box's regions in a runner's device buffers, sized for a token budget of ``tokens``: the
    per-row ones for as many rows as the budget holds blocks, then the tokens (a row's width and its
    scratch column)."""
    rows = max(1, tokens // block_length)
    per_row = {name: rows for name in ("lengths", "block_starts", "hidden_suffix", "active", "thresholds")}
    return per_row | {"sampling": rows * COLUMNS, "extra": rows * extra_columns, "tokens": tokens + rows}


def _host_rows(
    rows: list[CycleRow],
    block_length: int,
    mask_id: int,
    pad_id: int,
    threshold: float,
    blocks: list[list[int] | None],
    extra: list[list[int]],
):
    """The box's lists by name: left-padded tokens and the scratch column [R, W + 1], then per row its
    length, block start, hidden-suffix flag, active flag and threshold, and, where a row samples, every
    row's sampling settings [R, COLUMNS] (RowSampling.host_columns), and the caller's ``extra`` integers."""
    contents = [_row_tokens(row, block_length, mask_id, block) for row, block in zip(rows, blocks)]
    width = max(len(c) for c in contents)
    sampling = RowSampling.host_columns([row.params for row in rows]) or []
    parts = {
        "tokens": [token for c in contents for token in [pad_id] * (width - len(c)) + c + [pad_id]],
        "lengths": [len(c) for c in contents],
        "block_starts": [width - len(c) + row.width for c, row in zip(contents, rows)],
        "hidden_suffix": [int(not row.suffix_visible) for row in rows],
        "active": [int(row.active) for row in rows],
        "thresholds": Floats(threshold if r.params.threshold is None else r.params.threshold for r in rows),
        "sampling": [value for settings in sampling for value in settings],
        "extra": [value for more in extra for value in more],
    }
    return parts, width


def build_box(
    rows: list[CycleRow],
    block_length: int,
    mask_id: int,
    pad_id: int,
    device: torch.device,
    threshold: float = 0.9,
    score_dtype: torch.dtype = torch.float32,
    buffers: DeviceBuffers | None = None,
    blocks: list[list[int] | None] | None = None,
    extra: list[list[int]] | None = None,
) -> CycleBox:
    """Left-pad every row to the widest one and compute positions, masks and block slots; the rows' lists
    go to the device in one copy, into ``buffers`` (the runner's; None: buffers of this box alone).
    ``blocks``: a row's active block as far as it was committed (None: fully masked); ``extra``: the same
    number of the caller's integers per row, sent in the same copy (``CycleBox.extra``)."""
    blocks = blocks or [None] * len(rows)
    parts, width = _host_rows(rows, block_length, mask_id, pad_id, threshold, blocks, extra or [])
    buffers = DeviceBuffers(device) if buffers is None else buffers
    sent = buffers.send(parts)  # the one host-to-device copy
    R = len(rows)
    tokens = sent["tokens"].view(R, width + 1)
    lengths, block_start, hidden, active = (
        sent[n] for n in ("lengths", "block_starts", "hidden_suffix", "active")
    )
    params = [row.params for row in rows]
    sampling = (
        None
        if not parts["sampling"]
        else RowSampling.from_device(sent["sampling"].view(R, -1), params, score_dtype)
    )
    columns = torch.arange(width, device=device)
    start = width - lengths
    real = columns[None, :] >= start[:, None]
    block_end = block_start + block_length
    visible = ~(hidden.bool()[:, None] & (columns[None, :] >= block_end[:, None]))
    positions = torch.zeros_like(tokens)
    positions[:, :width] = (columns[None, :] - start[:, None]).clamp(min=0)
    return CycleBox(
        tokens_with_scratch=tokens,
        positions_with_scratch=positions,
        tokens=tokens[:, :width],
        real=real,
        key_mask=real & visible,
        context=real & (columns[None, :] < block_end[:, None]),
        position_ids=positions[:, :width],
        block_slots=block_start[:, None] + torch.arange(block_length, device=device)[None, :],
        active=active.bool(),
        thresholds=sent["thresholds"].to(score_dtype),
        block_length=block_length,
        sampling=sampling,
        logprobs=[row.params.logprobs for row in rows]
        if any(row.params.logprobs is not None for row in rows)
        else None,
        host=BoxRows.of(rows, block_length),
        extra=sent["extra"].view(R, -1) if extra else None,
    )
