"""Linear layers whose every row rounds as it would among many rows: batch invariance for inputs of a
few rows.

A CPU's BLAS multiplies a matrix of 1, 2 or 3 rows with other kernels than one of 4 or more (torch's
oneDNN/MKL sgemm on one thread: a row's bits are the same for every row count from 4 up, and differ
below). A token that a batch multiplies among many rows and a request alone among 1 to 3 (a prompt of
1 to 3 tokens through DiffusionGemma's encoder, an expert that few tokens chose) would round otherwise,
so such inputs are padded with zero rows to ``MIN_ROWS`` and the padding dropped after. With more than one
torch thread the rows are split between threads and counts below 12 round otherwise again: a CPU
engine's outputs are the same alone and batched with one torch thread (what ``--pin`` and the tests use).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS = 4


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed over at least ``MIN_ROWS`` rows (x's leading dims flattened)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows >= MIN_ROWS or rows == 0:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    padded = torch.cat([flat, flat.new_zeros(MIN_ROWS - rows, flat.shape[1])])
    return F.linear(padded, weight, bias)[:rows].reshape(*x.shape[:-1], weight.shape[0])


class RowInvariantLinear(nn.Linear):
    """``nn.Linear`` (the same parameters and names) through ``linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
