"""What a rank keeps of one of the whole model's tensors, said before anything is read: a ``Cut``.

A cut is one or more boxes of the whole tensor (a (start, stop) range per dimension), laid side by side
along one dimension of the rank's tensor (the fused q/k/v rows of this rank's heads; an expert's gate and up
rows), or zeros of the whole's shape (a bias only rank 0 adds). A box may run past the whole's first
dimension: those rows are zeros (the last rank's run of a vocabulary padded to the ranks). ``fill`` writes
the cut into the rank's parameter straight from a ``TensorSource`` (a checkpoint file, a random draw, a
tensor in memory) a bounded chunk at a time, so that loading never holds more than the rank's share and
one chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine_pod.models.tensor_sources import Box, InMemory, TensorSource, whole_box

CHUNK_BYTES = 8 << 20  # the most one read of a source brings in at once (one row of the box at least)


@dataclass(frozen=True)
class Cut:
    boxes: tuple[Box, ...]  # pieces of the whole, side by side along ``dim`` in the rank's tensor
    dim: int = 0
    zeros: bool = False  # the rank's tensor is zeros of the whole's shape (boxes: that one whole box)

    @classmethod
    def whole(cls, shape: tuple[int, ...]) -> Cut:
        return cls((whole_box(tuple(shape)),))

    @classmethod
    def zeros_of(cls, shape: tuple[int, ...]) -> Cut:
        return cls((whole_box(tuple(shape)),), zeros=True)

    @classmethod
    def along(cls, shape: tuple[int, ...], dim: int, *ranges: tuple[int, int]) -> Cut:
        """The whole, but only ``ranges`` of dimension ``dim``, side by side (in the order given)."""
        full = whole_box(tuple(shape))
        return cls(tuple(full[:dim] + (span,) + full[dim + 1 :] for span in ranges), dim)

    def narrowed(self, dim: int, start: int, stop: int) -> Cut:
        """Each box narrowed to ``[start, stop)`` of dimension ``dim`` (a dimension the cut keeps whole):
        an expert parallel rank's experts of a cut over every expert."""
        boxes = tuple(box[:dim] + ((start, stop),) + box[dim + 1 :] for box in self.boxes)
        return Cut(boxes, self.dim, self.zeros)

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.boxes[0]
        sizes = [stop - start for start, stop in first]
        sizes[self.dim] = sum(box[self.dim][1] - box[self.dim][0] for box in self.boxes)
        return tuple(sizes)

    def fill(self, out: torch.Tensor, source: TensorSource, chunk_bytes: int = CHUNK_BYTES) -> None:
        """Write the cut of ``source`` into ``out`` (the rank's tensor, of ``shape``), a chunk at a time."""
        if tuple(out.shape) != self.shape:
            raise ValueError(f"a cut of shape {self.shape} does not fit a tensor of shape {tuple(out.shape)}")
        if self.zeros:
            out.zero_()
            return
        offset = 0
        for box in self.boxes:
            width = box[self.dim][1] - box[self.dim][0]
            _fill_box(out.narrow(self.dim, offset, width), source, box, chunk_bytes)
            offset += width

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        """The cut of a whole tensor in memory, as a tensor of its own."""
        out = torch.empty(self.shape, dtype=tensor.dtype, device=tensor.device)
        self.fill(out, InMemory(tensor))
        return out


def _fill_box(out: torch.Tensor, source: TensorSource, box: Box, chunk_bytes: int) -> None:
    """``out`` (the box's shape) from ``source``, a run of first-dimension rows at a time; rows past the
    whole's end are zeros."""
    if not box:  # a scalar
        out.copy_(source.read(box))
        return
    (start, stop), rest = box[0], box[1:]
    row_bytes = math.prod(b - a for a, b in rest) * out.element_size()
    step = max(1, chunk_bytes // max(1, row_bytes))
    end = min(stop, source.shape[0])
    for first in range(start, end, step):
        last = min(first + step, end)
        out.narrow(0, first - start, last - first).copy_(source.read(((first, last), *rest)))
    if end < stop:
        out.narrow(0, max(0, end - start), stop - max(start, end)).zero_()
