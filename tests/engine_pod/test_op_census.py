"""The op census (engine_pod/bench/op_census.py, census_run.py): it counts what it says it counts, and the
packed forwards of every family (LLaDA, LLaDA2.0, DiffusionGemma) attend once per layer and read nothing
back from the device, with MoE layers whose ops do not depend on the experts hit and first forwards whose
ops do not grow with the number of distinct lengths."""

from __future__ import annotations

import pytest
import torch

from engine_pod.bench.census_run import Scenario, decoding_for, prompt_lengths, run_scenario
from engine_pod.bench.op_census import counting
from engine_pod.models.loader import load_model


class _Tiny(torch.nn.Module):
    def forward_full(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_the_census_counts_syncs_host_reads_and_host_data_per_segment():
    model = _Tiny()
    x = torch.arange(6.0)
    with counting(model) as census:
        torch.tensor([1, 2, 3])  # host data: one copy on a GPU
        int(x.sum())  # _local_scalar_dense
        x.nonzero()
        x[x > 2]  # a boolean mask: nonzero inside the index
        model.forward_full(x).tolist()  # a forward of its own, then a host read
    host, forward, after = census.segments
    assert (forward.kind, forward.sync_count, forward.ops["aten.mul"]) == ("forward_full", 0, 1)
    assert host.host_to_device == 1
    assert host.syncs == {"aten._local_scalar_dense": 1, "aten.nonzero": 1, "aten.index": 1}
    assert after.syncs == {"Tensor.tolist": 1}
    assert torch.Tensor.tolist.__name__ == "tolist"  # put back


def test_prompt_lengths_have_the_asked_number_of_distinct_values():
    assert len(set(prompt_lengths(16, 4, 8))) == 4
    assert len(set(prompt_lengths(16, 16, 8))) == 16


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return {spec: load_model(spec) for spec in SPECS}


SPECS = ("random:llada-tiny", "random:llada2-tiny", "random:diffusion-gemma-tiny")


@pytest.mark.parametrize("spec", SPECS)
def test_packed_forwards_attend_once_per_layer_whatever_the_lengths(models, spec):
    loaded = models[spec]
    figures = {
        distinct: run_scenario(
            loaded, Scenario(spec, "blockserve-packed", 16, distinct, cycles=2), decoding_for(loaded)
        )
        for distinct in (1, 16)  # the extremes: one length, every row its own (`dllm census`: the grid)
    }
    for f in figures.values():
        assert f.attention_calls_per_layer == 1
        assert f.syncs_per_forward == 0
        assert f.syncs_per_step <= 1
        assert f.host_to_device_per_cycle <= 2
        assert f.new_attention_shapes <= 4
    first = [f.first_forward_ops for f in figures.values()]
    assert max(first) <= 1.05 * min(first), first
    moe = {n for f in figures.values() for n in f.moe_ops_per_call}
    assert len(moe) == (0 if spec == "random:llada-tiny" else 1), moe  # one count: the same ops every call
