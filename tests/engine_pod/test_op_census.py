"""The op census (engine_pod/bench/op_census.py, device_provenance.py, census_run.py): it counts what a GPU
run would (copies from the host, reads of device tensors, reads inside the attention op and the encoder:
each planted and seen), and the forwards of every family, with greedy, sampled and log-probability
requests and rows leaving at different steps, attend once per layer, read nothing inside a forward and
at most once per denoising step, with MoE layers whose ops do not depend on the experts hit and first
forwards whose ops do not grow with the number of distinct lengths."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine_pod.bench.census_grid import MODELS
from engine_pod.bench.census_run import Scenario, decoding_for, prompt_lengths, run_scenario
from engine_pod.bench.op_census import counting
from engine_pod.families.diffusion_gemma.attention import GemmaAttention
from engine_pod.loading.loader import load_model
from engine_pod.models import attention_backends
from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.ragged import Box, RaggedAttention, RowSpans

DEVICE = torch.device("cpu")  # the engine's device, named as the engine names it


class _Tiny(torch.nn.Module):
    def forward_batch(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_the_census_counts_copies_from_the_host_and_reads_of_the_device_as_a_gpu_makes_them():
    model = _Tiny()
    x = torch.arange(6.0, device=DEVICE)  # made on the device
    with counting(model) as census:
        host = torch.tensor([1, 2, 3])  # host data: no copy yet
        host.tolist()  # reading the host costs nothing
        moved = host.to(DEVICE)  # a copy
        moved + x[:3].long()  # device tensors only: nothing
        torch.tensor([4, 5], device=DEVICE)  # a copy
        torch.arange(3).to(DEVICE)  # a host factory moved: a copy
        torch.arange(3, device=DEVICE)  # made on the device: nothing
        x + torch.ones(6)  # a host tensor beside a device one: the copy it needs
        int(x.sum())  # a scalar read
        x.nonzero()
        x[x > 2]  # a boolean mask: nonzero inside the index
        x.cpu().tolist()  # one read (cpu); the host list is free
        model.forward_batch(x).tolist()  # a forward of its own, then a read
    host_segment, forward, after = census.segments
    assert (forward.kind, forward.sync_count, forward.ops["aten.mul"]) == ("forward_batch", 0, 1)
    assert host_segment.host_to_device == 4, host_segment.copies
    assert host_segment.syncs == {
        "Tensor.item": 1,
        "aten.nonzero": 1,
        "aten.index": 1,
        "Tensor.cpu": 1,
    }
    assert after.syncs == {"Tensor.tolist": 1}
    assert torch.Tensor.tolist.__name__ == "tolist" and torch.arange.__name__ == "arange"  # put back


def test_prompt_lengths_have_the_asked_number_of_distinct_values():
    assert len(set(prompt_lengths(16, 4, 8))) == 4
    assert len(set(prompt_lengths(16, 16, 8))) == 16


@pytest.fixture(scope="module")
def models():
    return census_models()


def census_models() -> dict:
    torch.set_num_threads(1)
    return {spec: load_model(spec) for spec in MODELS}


def census_figures(loaded, spec, policy="blockserve-packed", requests="greedy", remasking="threshold", **kw):
    """A scenario of 8 rows (each its own prompt length) over 2 cycles, in blocks of 8 (a canvas: its own)."""
    scenario = Scenario(spec, policy, kw.get("rows", 8), kw.get("distinct", 8), 2, requests, remasking)
    decoding = decoding_for(loaded, remasking)
    if not loaded.family.kind.canvas_rows:
        decoding = replace(decoding, block_length=8, steps_per_block=8)
    return run_scenario(loaded, scenario, decoding)


def test_a_read_planted_inside_the_attention_op_is_counted_in_its_forward(models, monkeypatch):
    kernel = attention_backends.cpu_kernel

    def reading(q, k, v, plan):
        q.sum().item()  # a planted read
        return kernel(q, k, v, plan)

    monkeypatch.setattr(attention_backends, "cpu_kernel", reading)
    figures = census_figures(models["random:llada-tiny"], "random:llada-tiny")
    assert figures.syncs_per_forward >= 1 and figures.attention_calls_per_layer == 1


def test_a_read_planted_inside_the_encoder_is_counted_in_its_forward(models, monkeypatch):
    encode = GemmaAttention.encode

    def reading(self, *args, **kwargs):
        out = encode(self, *args, **kwargs)
        bool(self.q_proj.weight.sum() > 0)  # a planted read
        return out

    monkeypatch.setattr(GemmaAttention, "encode", reading)
    figures = census_figures(models["random:diffusion-gemma-tiny"], "random:diffusion-gemma-tiny")
    assert figures.syncs_per_forward >= 1


@pytest.mark.parametrize("spec", MODELS)
def test_packed_forwards_do_not_grow_with_the_lengths_and_moe_ops_do_not_depend_on_the_experts(models, spec):
    loaded = models[spec]
    figures = {distinct: census_figures(loaded, spec, rows=16, distinct=distinct) for distinct in (1, 16)}
    first = [f.first_forward_ops for f in figures.values()]
    assert max(first) <= 1.05 * min(first), first
    assert all(f.host_to_device_per_cycle <= 2 for f in figures.values())
    moe = {n for f in figures.values() for n in f.moe_ops_per_call}
    has_moe = spec in ("random:llada2-tiny", "random:diffusion-gemma-tiny")
    assert len(moe) == (1 if has_moe else 0), moe  # one count: the same ops every call


@pytest.mark.parametrize(
    "spec", ["random:llada-tiny", "random:dream-tiny", "random:llada2-tiny", "random:sdar-tiny"]
)
@pytest.mark.parametrize("requests", ["greedy", "sampled"])
def test_the_work_between_packed_forwards_does_not_grow_with_the_rows(models, spec, requests):
    """Batch operations, not work per row: a step's host work is the same for 4 rows and for 24."""
    loaded = models[spec]
    few, many = (census_figures(loaded, spec, requests=requests, rows=n, distinct=n) for n in (4, 24))
    assert many.host_ops_per_step == few.host_ops_per_step, (few.host_ops_per_step, many.host_ops_per_step)


class _Attends(torch.nn.Module):
    """A forward that attends once over the plan it is given."""

    def forward_batch(self, q: torch.Tensor, plan: RaggedAttention) -> torch.Tensor:
        return ragged_attention(q, q, q, plan)


def test_a_padded_box_is_a_new_attention_shape_for_each_extent_and_packed_rows_are_not():
    model, heads = _Attends(), 2
    boxes = [
        Box(rows, width, width, torch.ones(rows, 1, width, dtype=torch.bool))
        for rows, width in ((2, 4), (3, 5))
    ]
    packed = [RowSpans([0, n], [n, n], [0, n], [n, n]) for n in (4, 5)]
    with counting(model) as census:
        for box in boxes:
            model.forward_batch(
                torch.ones(box.rows * box.q_width, heads, 8), RaggedAttention.over_box(box, DEVICE)
            )
        for spans in packed:
            model.forward_batch(torch.ones(spans.queries, heads, 8), RaggedAttention(spans, DEVICE))
    forwards = [segment for segment in census.segments if segment.kind == "forward_batch"]
    box_shapes = set().union(*(segment.attention_shapes for segment in forwards[:2]))
    packed_shapes = set().union(*(segment.attention_shapes for segment in forwards[2:]))
    assert len(box_shapes) == 2 and len(packed_shapes) == 1
