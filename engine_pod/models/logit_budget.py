"""How the LM head's logits are materialized: in chunks of positions.

One place decides it for every family (``SelectedHidden`` in models/transformer.py, DiffusionGemma's
denoise): ``LogitBudget.chunk`` (decoding/config.py, from ``DecodingConfig.max_materialized_logits``) is the number of positions whose full-vocabulary logits exist at once.
Chunking never changes a result: everything computed from the logits is per position, and the head
multiplies a chunk padded with zero rows to a multiple of 4 rows and at least 16 (a CPU's BLAS rounds a
matrix of 1 to 3 rows, with several threads one of fewer than 12, and in float64 the last 1 to 3 rows of
any matrix, otherwise: models/row_invariant.py), so a position's logits have the same bits in any chunk.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine_pod.decoding.config import LogitBudget

HEAD_MIN_ROWS = 16  # a chunk's rows are padded to at least this many (measured: 12 and up round alike)
HEAD_ROW_MULTIPLE = 4  # and to a multiple of this (float64 GEMM rounds a remainder of 1 to 3 rows otherwise)


def chunked_rows(x: torch.Tensor, budget: LogitBudget, vocab: int) -> tuple[torch.Tensor, ...]:
    """``x`` [n, ...] split along its first dim into the budget's chunks (one empty piece for n = 0)."""
    if x.shape[0] == 0:
        return (x,)
    return x.split(budget.chunk(vocab))


def apply_head(head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``head(x)`` for ``x`` [n, D], computed over a multiple of ``HEAD_ROW_MULTIPLE`` rows, at least
    ``HEAD_MIN_ROWS``."""
    rows = x.shape[0]
    padded = max(HEAD_MIN_ROWS, -(-rows // HEAD_ROW_MULTIPLE) * HEAD_ROW_MULTIPLE)
    if rows == 0 or padded == rows:
        return head(x)
    return head(torch.cat([x, x.new_zeros(padded - rows, x.shape[1])]))[:rows]
