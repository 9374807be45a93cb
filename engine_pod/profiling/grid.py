"""The batch shapes a profile measures: a fit grid from narrow-and-tall to wide-and-short, and held-out
shapes that check the fit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    rows: int
    width: int
    peak_bytes: int = 0  # what the fit uses: CUDA reserved peak, CPU peak resident memory
    held_out: bool = False
    allocated_bytes: int = 0  # CUDA: peak of live tensors (at most peak_bytes); CPU: 0

    @property
    def tokens(self) -> int:
        return self.rows * self.width


def grid(max_tokens: int, block_length: int, canvas: bool = False) -> list[Point]:
    """Fit shapes spanning narrow-and-tall to wide-and-short batches, plus two held-out shapes. Canvases:
    rows of a one-token context (a canvas's logits over the vocabulary, not its context, dominate a row's
    memory, so the narrowest rows cost the most per token and a budget fitted on them holds for wider)."""
    if canvas:
        width, most = block_length + 1, max(1, max_tokens // (block_length + 1))
        fit = [Point(rows, width) for rows in sorted({max(1, most // f) for f in (1, 2, 4, 8, 16)})]
        return fit + [
            Point(max(1, most * 3 // 8), width, held_out=True),
            Point(max(1, most * 3 // 4), width, held_out=True),
        ]
    widths = [w for w in (2 * block_length, 256, 1024) if w >= 2 * block_length]
    shapes = {(max(1, max_tokens // (f * w)), w) for w in sorted(set(widths)) for f in (1, 4, 16)}
    fit = [Point(r, w) for r, w in sorted(shapes) if r * w <= max_tokens and r * w >= 4 * block_length]
    held = [
        Point(max(1, max_tokens // (3 * 192)), 192, held_out=True),
        Point(max(1, max_tokens // (2 * 384)), 384, held_out=True),
    ]
    return fit + held
