"""Attention over a padded box: grouped-query K/V are expanded, so a mask never forces the math kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine_pod.loading.config_readers import config_from_dict
from engine_pod.loading.loader import build_model
from engine_pod.models import sdpa
from engine_pod.models.forward_batch import ForwardBatch
from tests.factories import dream_config


def _naive_attention(q, k, v, key_mask):
    """Softmax over allowed keys, query head h reading KV head h // groups, in float64."""
    groups = q.shape[1] // k.shape[1]
    k = k.double()[:, torch.arange(q.shape[1]) // groups]
    v = v.double()[:, torch.arange(q.shape[1]) // groups]
    scores = q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return scores.softmax(-1) @ v


def _padded_inputs(rows=3, heads=8, kv_heads=2, queries=5, keys=11, head_dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, queries, head_dim, generator=generator, dtype=torch.float64)
    k = torch.randn(rows, kv_heads, keys, head_dim, generator=generator, dtype=torch.float64)
    v = torch.randn(rows, kv_heads, keys, head_dim, generator=generator, dtype=torch.float64)
    lengths = torch.tensor([keys, keys - 4, 3])[:rows]
    key_mask = torch.arange(keys)[None, :] >= (keys - lengths)[:, None]  # left padding
    return q, k, v, key_mask


def test_grouped_query_attention_with_a_mask_matches_the_naive_definition():
    q, k, v, key_mask = _padded_inputs()
    out = sdpa.attend(q, k, v, key_mask)
    torch.testing.assert_close(out, _naive_attention(q, k, v, key_mask), rtol=1e-10, atol=1e-10)


def test_grouped_query_attention_matches_sdpa_native_gqa_bit_for_bit_in_float64():
    q, k, v, key_mask = _padded_inputs(seed=1)
    native = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :], enable_gqa=True)
    torch.testing.assert_close(sdpa.attend(q, k, v, key_mask), native, rtol=1e-12, atol=1e-12)


def test_a_masked_grouped_query_call_reaches_sdpa_with_one_kv_head_per_query_head(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        calls.append((q.shape[1], k.shape[1], v.shape[1], kwargs))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", spy)
    config = config_from_dict(dream_config(heads=4, kv_heads=2))
    model = build_model(config, torch.device("cpu"), torch.float32)
    torch.nn.init.normal_(model.embed_tokens.weight)
    ids = torch.randint(0, 400, (2, 12))
    key_mask = torch.ones(2, 12, dtype=torch.bool)
    key_mask[1, :5] = False
    positions = (key_mask.long().cumsum(1) - 1).clamp(min=0)
    every = torch.arange(24)
    model.forward_batch(ForwardBatch.box_over_itself(ids, positions, key_mask), (every // 12, every % 12))
    assert len(calls) == config.num_layers
    for query_heads, key_heads, value_heads, kwargs in calls:
        assert query_heads == key_heads == value_heads == 4
        assert "enable_gqa" not in kwargs and kwargs["attn_mask"] is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_on_cuda_masked_grouped_query_attention_runs_on_the_memory_efficient_kernel():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, key_mask = (t.cuda() for t in _padded_inputs(keys=64, head_dim=64))
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):  # raises if only the math kernel could run
        out = sdpa.attend(q, k, v, key_mask)
    torch.testing.assert_close(
        out.double().cpu(), _naive_attention(q, k, v, key_mask).cpu(), atol=2e-2, rtol=2e-2
    )
