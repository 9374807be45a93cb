"""Where a whole tensor's values come from, a box at a time: a checkpoint file, a random draw, memory.

A ``Box`` is a (start, stop) range in each dimension of the whole tensor. A source gives any box of
itself without being held whole, so that a process that keeps part of a tensor (a tensor-parallel rank's
slice: ``parallel/cuts.py``) reads or draws only that part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

Box = tuple[tuple[int, int], ...]  # (start, stop) in each dimension of the whole tensor


class TensorSource(Protocol):
    """A whole tensor that can give any box of itself without being held whole."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def read(self, box: Box) -> torch.Tensor:
        """The box of the whole tensor (its own tensor, or a view the caller copies at once)."""
        ...


def whole_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, n) for n in shape)


def box_slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(start, stop) for start, stop in box)


@dataclass(frozen=True)
class InMemory:
    """A tensor already in memory, as a source (a stacked scalar, a test's tensor)."""

    tensor: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    def read(self, box: Box) -> torch.Tensor:
        return self.tensor[box_slices(box)]


@dataclass(frozen=True)
class JoinedPieces:
    """Pieces stored apart, read as one tensor: side by side along the first dimension."""

    pieces: tuple[TensorSource, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.pieces[0].shape
        return (sum(piece.shape[0] for piece in self.pieces), *first[1:])

    def read(self, box: Box) -> torch.Tensor:
        (start, stop), rest, parts, at = box[0], box[1:], [], 0
        for piece in self.pieces:
            low, high = max(start, at), min(stop, at + piece.shape[0])
            if low < high:
                parts.append(piece.read(((low - at, high - at), *rest)))
            at += piece.shape[0]
        return torch.cat(parts)
