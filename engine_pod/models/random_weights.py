"""Random weights (``--model random:PRESET``) that any rank draws its own part of, and only that part.

Each parameter is cut into tiles of ``TILE_ROWS`` x ``TILE_COLUMNS`` (its leading dimensions flattened into
rows, its last dimension the columns), and each tile is drawn from a generator of its own, seeded by the
model's seed, the parameter's name and the tile's place. A rank draws the tiles its cut of the parameter
overlaps, and keeps the overlap: every group size holds the same model as one process, and no rank draws a
tensor whole (a parameter split by columns costs a rank the tiles of its columns, a tile's height at a
time). Drawn in float32 on the model's device and cast into each parameter: the same model in every dtype
(to its precision), deterministic for a given seed and device type.

How each parameter is drawn is its family's ``random_law`` (``NORMAL_LAW`` here: N(0, 0.02), norms one).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine_pod.models.tensor_sources import Box

TILE_ROWS, TILE_COLUMNS = 128, 2048  # one tile, one generator


@dataclass(frozen=True)
class Law:
    """A parameter's values: N(mean, std), or every value ``mean`` where std is 0."""

    mean: float
    std: float = 0.0


def normal_law(name: str, shape: tuple[int, ...]) -> Law:
    """The generic draw: N(0, 0.02), norms' weights one."""
    return Law(1.0) if name.endswith("norm.weight") else Law(0.0, 0.02)


LawOf = Callable[[str, tuple[int, ...]], Law]


@dataclass(frozen=True)
class RandomTensor:
    """One parameter of a random model, drawn a box at a time."""

    name: str
    shape: tuple[int, ...]
    law: Law
    seed: int
    device: torch.device

    def read(self, box: Box) -> torch.Tensor:
        out = torch.empty([stop - start for start, stop in box], dtype=torch.float32, device=self.device)
        if self.law.std == 0 or not out.numel():
            return out.fill_(self.law.mean)
        leading, (first, last) = box[:-1], box[-1] if box else (0, 1)
        rows = out.view(-1, last - first)
        run = leading[-1][1] - leading[-1][0] if leading else 1
        for index, start in enumerate(_run_starts(self.shape[:-1], leading)):
            self._draw(rows[index * run : (index + 1) * run], start, first, last)
        return out

    def _draw(self, out: torch.Tensor, row: int, first: int, last: int) -> None:
        """Rows ``[row, row + len(out))`` and columns ``[first, last)`` of the flattened parameter."""
        total_rows, total_columns = math.prod(self.shape[:-1]), self.shape[-1] if self.shape else 1
        for tile_row in range(row // TILE_ROWS, -(-(row + out.shape[0]) // TILE_ROWS)):
            top = tile_row * TILE_ROWS
            for tile_column in range(first // TILE_COLUMNS, -(-last // TILE_COLUMNS)):
                left = tile_column * TILE_COLUMNS
                tile = self._tile(
                    tile_row,
                    tile_column,
                    min(TILE_ROWS, total_rows - top),
                    min(TILE_COLUMNS, total_columns - left),
                )
                r0, r1 = max(row, top), min(row + out.shape[0], top + tile.shape[0])
                c0, c1 = max(first, left), min(last, left + tile.shape[1])
                out[r0 - row : r1 - row, c0 - first : c1 - first] = tile[
                    r0 - top : r1 - top, c0 - left : c1 - left
                ]

    def _tile(self, tile_row: int, tile_column: int, height: int, width: int) -> torch.Tensor:
        key = f"{self.seed}/{self.name}/{tile_row}/{tile_column}".encode()
        seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**63 - 1)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        tile = torch.empty(height, width, dtype=torch.float32, device=self.device)
        return tile.normal_(self.law.mean, self.law.std, generator=generator)


def _run_starts(shape: tuple[int, ...], box: Box) -> list[int]:
    """The first flattened row of each run of the box's rows that lie together (its last leading
    dimension's range), in order; one run at row 0 for a tensor without leading dimensions."""
    if not shape:
        return [0]
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    outer = itertools.product(*(range(start, stop) for start, stop in box[:-1]))
    return [sum(i * s for i, s in zip(index, strides)) + box[-1][0] for index in outer]


def random_sources(
    shapes: dict[str, tuple[int, ...]], law_of: LawOf, seed: int, device: torch.device
) -> dict[str, RandomTensor]:
    """A source for each of the whole model's parameters (name -> whole shape)."""
    return {
        name: RandomTensor(name, shape, law_of(name, shape), seed, device) for name, shape in shapes.items()
    }
