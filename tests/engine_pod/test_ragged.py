"""Ragged attention (engine_pod/models/ragged.py): every row attends over its own keys only, whatever the
grouping (views of equal-length runs, gathered groups with padding), equal in float64 to one SDPA call
per row."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from engine_pod.models import ragged
from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.attention_rules import Masking, SdpaStyle
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
    torch.testing.assert_close(ragged_attention(q, k, v, plan), _per_row(q, k, v, spans), rtol=0, atol=1e-12)


def test_groups_of_one_length_in_memory_order_are_views_not_gathers():
    spans = RowSpans([0, 5, 10, 13], [5, 5, 3, 3], [0, 5, 10, 13], [5, 5, 3, 3])
    plan = RaggedAttention(spans, torch.device("cpu"))
    assert len(plan.groups) == 2
    assert all(isinstance(group.queries, tuple) and isinstance(group.keys, tuple) for group in plan.groups)
    assert all(group.k_valid is None for group in plan.groups)


def _varlen_on_cpu(
    q,
    k,
    v,
    cu_q,
    cu_k,
    max_q,
    max_k,
    *,
    enable_gqa=False,
    seqused_k=None,
    scale=None,
    window_size=(-1, -1),
    **_,
):
    """torch's varlen_attn as documented (sequence i: queries cu_q[i]:cu_q[i+1], keys from cu_k[i], seqused_k[i]
    of them; a (left, right) window around each query's place, queries aligned to the last keys as flash
    attention aligns them), one SDPA per sequence: what the GPU kernel computes."""
    out = torch.empty_like(q)
    for i in range(len(cu_q) - 1):
        qs, qe, ks = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i])
        ke = ks + int(seqused_k[i]) if seqused_k is not None else int(cu_k[i + 1])
        assert qe - qs <= max_q and ke - ks <= max_k
        place = torch.arange(ke - ks - (qe - qs), ke - ks)[:, None]  # each query's key position
        keys = torch.arange(ke - ks)[None]
        left, right = window_size
        mask = torch.ones(qe - qs, ke - ks, dtype=torch.bool)
        if right >= 0:
            mask &= keys <= place + right
        if left >= 0:
            mask &= keys >= place - left
        part = F.scaled_dot_product_attention(
            q[qs:qe].transpose(0, 1),
            k[ks:ke].transpose(0, 1),
            v[ks:ke].transpose(0, 1),
            attn_mask=mask,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        out[qs:qe] = part.transpose(0, 1)
    return out


MASKINGS = {
    "bidirectional": Masking(),
    "block-causal": Masking(block=4),
    "causal": Masking(causal=True),
    "sliding": Masking(causal=True, window=5),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("masking", sorted(MASKINGS))
def test_the_gpu_backends_varlen_sequences_compute_what_the_reference_computes(monkeypatch, seed, masking):
    """The GPU kernel's metadata (models/attention_backends.py): one varlen call whose sequences (block-causal
    rows cut at their block boundaries), window and scale give the reference's outputs (varlen emulated
    on the CPU), for every masking a family uses."""
    from torch.nn.attention import varlen as varlen_module

    from engine_pod.models import attention_backends

    monkeypatch.setattr(varlen_module, "varlen_attn", _varlen_on_cpu)
    rng = random.Random(seed)
    rows = rng.randint(1, 8)
    k_len = [rng.choice([4, 8, 12, 16]) for _ in range(rows)]
    # block diffusion: a row's queries are its last keys, one block or reaching back over whole blocks
    masking = MASKINGS[masking]
    q_len = [rng.choice([4, n]) if masking.block else rng.choice([1, 3, n]) for n in k_len]
    order = list(range(rows))
    rng.shuffle(order)
    q_start, k_start, q_at, k_at = [0] * rows, [0] * rows, 0, 0
    for r in order:
        q_start[r], k_start[r] = q_at, k_at
        q_at, k_at = q_at + q_len[r], k_at + k_len[r]
    style = SdpaStyle(scale=1.0, native_gqa=True, head_major=True) if masking.causal else SdpaStyle()
    plan = RaggedAttention(RowSpans(q_start, q_len, k_start, k_len), torch.device("cpu"), masking, style)
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(q_at, 4, 8, dtype=torch.float64, generator=generator)
    k = torch.randn(k_at, 2, 8, dtype=torch.float64, generator=generator)
    v = torch.randn(k_at, 2, 8, dtype=torch.float64, generator=generator)
    expected = ragged_attention(q, k, v, plan)
    torch.testing.assert_close(attention_backends.varlen(plan, q, k, v), expected, rtol=0, atol=1e-12)
