"""Linear layers whose every row rounds alike in any batch: batch invariance by construction.

A CPU's BLAS picks its kernel, its blocking and its split between threads by the problem's shape, and a
row's bits follow that choice: MKL multiplies 1 to 3 rows (AMD) or 1 to 15 (its Intel kernels) otherwise
than 64, and its vendor-neutral path (``MKL_CBWR=COMPATIBLE``) rounds the rows of a partial micro-tile
otherwise than full ones. So a token that a batch multiplies among many rows and a request alone among a
few would round otherwise, and which row counts differ depends on the CPU.

Here the library never sees the batch: ``linear`` cuts the rows into tiles of exactly ``TILE_ROWS`` rows
(the last padded with zero rows) and multiplies them as one batched matmul of identical problems, so
every call the library serves is the same [TILE_ROWS, in] x [in, out] product whatever the batch, and a
row's place in its tile is a full micro-tile's row (``TILE_ROWS`` is a multiple of every micro-tile
height in use: 1, 2, 4, 8, 16). ``tests/engine_pod/test_kernel_regimes.py`` runs the invariance tests
under every MKL code path and under its Intel kernels forced on any x86 CPU, and checks that a plain
``F.linear`` does differ there (so the test would catch a construction that leans on the kernels).
With more than one torch thread MKL splits even one problem between threads by the batch's size on
Intel CPUs: the outputs are the same alone and batched with one torch thread (what ``--pin`` and the
tests use).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

TILE_ROWS = 32  # rows per multiplied tile


def tiled_rows(rows: int) -> int:
    """The rows ``rows`` are multiplied as: the next multiple of ``TILE_ROWS``."""
    return -(-rows // TILE_ROWS) * TILE_ROWS


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with x's rows (its leading dims flattened) multiplied in tiles of
    ``TILE_ROWS`` rows."""
    if x.dtype != weight.dtype or not x.numel():
        return F.linear(x, weight, bias)
    rows, inputs = x.numel() // x.shape[-1], x.shape[-1]
    flat = x.reshape(rows, inputs)
    padded = tiled_rows(rows)
    flat = F.pad(flat, (0, 0, 0, padded - rows))  # also when nothing is added: the same ops for every count
    tiles = flat.view(padded // TILE_ROWS, TILE_ROWS, inputs)
    out = torch.bmm(tiles, weight.t().unsqueeze(0).expand(tiles.shape[0], inputs, weight.shape[0]))
    out = out.view(padded, weight.shape[0])[:rows]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


class RowInvariantLinear(nn.Linear):
    """``nn.Linear`` (the same parameters and names) through ``linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class PaddedGroups(NamedTuple):
    """Rows grouped by expert for ``grouped_mm``, each group padded with zero rows to a multiple of
    ``TILE_ROWS``."""

    rows: torch.Tensor  # [pairs] each sorted pair's row in the padded layout
    ends: torch.Tensor  # [E] int32, where each expert's padded group ends

    @staticmethod
    def room(pairs: int, num_experts: int) -> int:
        """Rows the padded layout of ``pairs`` rows over ``num_experts`` groups may take."""
        return pairs + (TILE_ROWS - 1) * num_experts


def padded_groups(chosen: torch.Tensor, num_experts: int) -> PaddedGroups:
    """Groups of the sorted experts ``chosen`` [pairs], each padded to a multiple of ``TILE_ROWS`` rows,
    and the pairs of any higher key (another rank's experts under expert parallelism) after the last group,
    unpadded: computed on the device from the sorted list (searchsorted, no count read back). A grouped
    matmul over them multiplies every expert's rows as one product of a multiple of ``TILE_ROWS`` rows,
    however many tokens chose the expert."""
    numbers = torch.arange(num_experts + 1, device=chosen.device, dtype=chosen.dtype)
    bounds = torch.searchsorted(chosen, numbers)  # where each group begins; bounds[num_experts]: the rest
    starts, counts = bounds[:-1], bounds[1:] - bounds[:-1]
    padded = (counts + TILE_ROWS - 1) // TILE_ROWS * TILE_ROWS
    ends = padded.cumsum(0)
    group = chosen.clamp(max=num_experts)  # the rest: one more group after the last
    first_row = torch.cat([ends - padded, ends[-1:]])
    rank = torch.arange(chosen.shape[0], device=chosen.device) - torch.cat([starts, bounds[-1:]])[group]
    return PaddedGroups(first_row[group] + rank, ends.to(torch.int32))


def product_of(module: nn.Module):
    """The matrix product a layer multiplies by: ``linear`` for a row-invariant layer, else ``F.linear``
    (for a layer that multiplies its weights otherwise than its own forward, e.g. fused projections)."""
    return linear if isinstance(module, RowInvariantLinear) else F.linear
