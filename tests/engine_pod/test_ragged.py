"""Ragged attention (engine_pod/models/ragged.py): every row attends over its own keys only, whatever the
grouping (views of equal-length runs, gathered groups with padding), equal in float64 to one SDPA call
per row."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from engine_pod.models import ragged
from engine_pod.models.ragged import RaggedAttention, RowSpans


def _per_row(q, k, v, spans: RowSpans) -> torch.Tensor:
    out = torch.zeros_like(q)
    for qs, ql, ks, kl in zip(spans.q_start, spans.q_len, spans.k_start, spans.k_len):
        if ql == 0:
            continue
        part = F.scaled_dot_product_attention(
            q[qs : qs + ql].transpose(0, 1), k[ks : ks + kl].transpose(0, 1), v[ks : ks + kl].transpose(0, 1)
        )
        out[qs : qs + ql] = part.transpose(0, 1)
    return out


def _spans(rng: random.Random, rows: int, shuffled: bool) -> RowSpans:
    """Rows of a few lengths (so some share one), laid out in a shuffled order when asked."""
    k_len = [rng.choice([3, 7, 7, 8, 20, 21]) for _ in range(rows)]
    q_len = [rng.choice([0, n, n, min(n, 4)]) for n in k_len]
    order = list(range(rows))
    if shuffled:
        rng.shuffle(order)
    q_start, k_start, q_at, k_at = [0] * rows, [0] * rows, 0, 0
    for r in order:
        q_start[r], k_start[r] = q_at, k_at
        q_at, k_at = q_at + q_len[r], k_at + k_len[r]
    return RowSpans(q_start, q_len, k_start, k_len)


@pytest.mark.parametrize("tolerance", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("seed", range(6))
def test_every_row_attends_over_its_own_keys_only(monkeypatch, tolerance, seed):
    monkeypatch.setattr(ragged, "LENGTH_TOLERANCE", tolerance)
    rng = random.Random(seed)
    spans = _spans(rng, rng.randint(1, 12), shuffled=seed % 2 == 1)
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(spans.queries, 4, 8, dtype=torch.float64, generator=generator)
    keys = sum(spans.k_len)
    k = torch.randn(keys, 4, 8, dtype=torch.float64, generator=generator)
    v = torch.randn(keys, 4, 8, dtype=torch.float64, generator=generator)
    plan = RaggedAttention(spans, torch.device("cpu"))
    torch.testing.assert_close(plan(q, k, v), _per_row(q, k, v, spans), rtol=0, atol=1e-12)


def test_groups_of_one_length_in_memory_order_are_views_not_gathers():
    spans = RowSpans([0, 5, 10, 13], [5, 5, 3, 3], [0, 5, 10, 13], [5, 5, 3, 3])
    plan = RaggedAttention(spans, torch.device("cpu"))
    assert len(plan.groups) == 2
    assert all(isinstance(group.queries, tuple) and isinstance(group.keys, tuple) for group in plan.groups)
    assert all(group.k_valid is None for group in plan.groups)
