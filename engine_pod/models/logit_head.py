"""How the LM head's logits are materialized: in chunks of positions, optionally over k candidates.

One place decides it for every family (``SelectedHidden`` in models/transformer.py, DiffusionGemma's
denoise): ``LogitBudget.chunk`` (models/logit_budget.py, from ``DecodingConfig.max_materialized_logits``) is the number of positions whose full-vocabulary logits exist at once.
Chunking never changes a result: everything computed from the logits is per position, and the head
multiplies a chunk padded with zero rows to a multiple of ``row_invariant.TILE_ROWS`` (a CPU's BLAS
rounds a matrix of a few rows, and the rows of a partial tile, otherwise: models/row_invariant.py), so a
position's logits have the same bits in any chunk.

With candidates (``DecodingConfig.logit_candidates``, k > 0 and below the vocabulary), each position's
candidates are the k tokens ranked first by the LM head applied in bfloat16 (a cheap score: the final
hidden state against the head's own rows, half the bytes of float32 scores, ranking the tokens almost as
the exact head does), then the exact logits of those k only, in the model's dtype. Everything computed
from them (proposal, confidence, a sampled draw, log probabilities) is over those k: the softmax is
renormalized over the candidates, so a confidence is at least the full softmax's (the tokens left out
carry no probability), and a sampled row's noise is drawn per candidate rank.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine_pod.models.logit_budget import LogitBudget
from engine_pod.models.row_invariant import product_of, tiled_rows

CANDIDATE_SCORE_DTYPE = torch.bfloat16
CANDIDATE_GATHER_ENTRIES = 1 << 24  # the candidates' gathered head rows per piece (entries)


def chunked_rows(x: torch.Tensor, budget: LogitBudget, vocab: int) -> tuple[torch.Tensor, ...]:
    """``x`` [n, ...] split along its first dim into the budget's chunks (one empty piece for n = 0)."""
    if x.shape[0] == 0:
        return (x,)
    return x.split(budget.chunk(vocab))


def apply_head(head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``head(x)`` for ``x`` [n, D], computed over a multiple of ``TILE_ROWS`` rows."""
    rows = x.shape[0]
    if rows == 0:
        return head(x)
    padded = tiled_rows(rows)  # padded also when nothing is added: the same ops for every count
    return head(torch.nn.functional.pad(x, (0, 0, 0, padded - rows)))[:rows]


def _score_weight(head: nn.Module) -> torch.Tensor:
    """The head's weight in the candidates' score dtype, cast once per weight version."""
    weight = head.weight
    key = (weight.data_ptr(), weight._version, weight.dtype)
    cached = head.__dict__.get("_candidate_weight")
    if cached is None or cached[0] != key:
        cached = (key, weight.detach().to(CANDIDATE_SCORE_DTYPE))
        head.__dict__["_candidate_weight"] = cached
    return cached[1]


def candidate_logits(
    hidden: torch.Tensor, head: nn.Module, k: int, never: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact logits [n, k] of each position's k candidates and their token ids [n, k] (ranked by the
    bfloat16 head, ``never`` never a candidate)."""
    low = _score_weight(head)
    product = product_of(head)  # the head's own (row_invariant.linear under --batch-invariant)
    scores = apply_head(lambda x: product(x, low), hidden.to(CANDIDATE_SCORE_DTYPE))
    if never is not None:
        scores[:, never] = float("-inf")
    ids = scores.topk(k, dim=-1).indices
    del scores
    weight = head.weight
    step = max(1, CANDIDATE_GATHER_ENTRIES // (k * weight.shape[1]))
    parts = [
        torch.einsum("nd,nkd->nk", piece, weight[rows])
        for piece, rows in zip(hidden.split(step), ids.split(step))
    ]
    exact = torch.cat(parts) if parts else hidden.new_zeros(0, k)
    return exact, ids
