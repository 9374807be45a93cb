"""The attention plans' varlen batches that the builders derive on the device from the cycle's copy (no
copy per plan; models/ragged.py ``varlen_on_device``, kinds/bidirectional/packing.py, kinds/block_causal/batches.py) are
the sequences the host would have cut from the same spans, and the varlen kernel (emulated on the CPU, as
torch documents it) computes over them what the reference computes, in real cycles of the dual-cache and
the paged runners with rows leaving at different steps."""

from __future__ import annotations

import pytest
import torch

from engine_pod.bench.census_run import Scenario, decoding_for, run_scenario
from engine_pod.loading.loader import load_model
from engine_pod.models import attention_backends, ragged
from tests.engine_pod.test_ragged import _varlen_on_cpu


def _sequences(rows: list[list[int]]) -> list[tuple[int, int, int, int]]:
    """(query start, query count, key start, keys used) of each sequence with queries."""
    offsets, k_start, k_len = rows
    return [
        (offsets[i], offsets[i + 1] - offsets[i], k_start[i], k_len[i])
        for i in range(len(offsets) - 1)
        if offsets[i + 1] > offsets[i]
    ]


@pytest.mark.parametrize(
    "spec", ["random:llada-tiny", "random:dream-tiny", "random:llada2-tiny", "random:diffusion-gemma-tiny"]
)
def test_plans_derived_on_the_device_are_the_hosts_sequences_and_attend_as_the_reference(spec, monkeypatch):
    from torch.nn.attention import varlen as varlen_module

    monkeypatch.setattr(varlen_module, "varlen_attn", _varlen_on_cpu)
    plans = []
    init = ragged.RaggedAttention.__init__

    def keep(plan, *args, **kwargs):
        init(plan, *args, **kwargs)
        plans.append(plan)

    monkeypatch.setattr(ragged.RaggedAttention, "__init__", keep)
    loaded = load_model(spec, dtype="float64")
    run_scenario(
        loaded, Scenario(spec, "blockserve-packed", 6, 6, cycles=2, requests="sampled"), decoding_for(loaded)
    )
    derived = [plan for plan in plans if plan.varlen is not None]  # settled by their builders
    assert len(derived) > 10
    generator = torch.Generator().manual_seed(0)
    for plan in derived[:: max(1, len(derived) // 12)]:
        batch = plan.varlen
        keys = int(batch.metadata[1, -1])
        first, last, max_q, max_k, rows = attention_backends.varlen_rows(plan, keys)
        assert (first, last, max_q, max_k) == (batch.first, batch.last, batch.max_q, batch.max_k)
        assert _sequences(batch.metadata.tolist()) == _sequences(rows)
        q = torch.randn(plan.queries, 4, 8, dtype=torch.float64, generator=generator)
        k = torch.randn(keys, 2, 8, dtype=torch.float64, generator=generator)
        v = torch.randn(keys, 2, 8, dtype=torch.float64, generator=generator)
        expected = plan.reference(q, k, v)
        torch.testing.assert_close(attention_backends.varlen(plan, q, k, v), expected, rtol=0, atol=1e-12)
