"""A runner's persistent device buffers (engine_pod/device_buffers.py): a cycle's lists go into named regions
in one host-to-device copy; every family's runner keeps each region at one address from cycle to cycle
while its lists fit, and a cycle that outgrows them grows them and gives the tokens of a fresh runner."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine_pod.bench.census_grid import MODELS
from engine_pod.bench.census_run import decoding_for
from engine_pod.bench.op_census import counting
from engine_pod.device_buffers import DeviceBuffers, Floats
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput

FAMILIES = ("random:llada-tiny", "random:llada2-tiny", "random:diffusion-gemma-tiny")  # dual, paged, canvas
assert set(FAMILIES) <= set(MODELS)


def test_a_send_is_one_copy_into_regions_that_keep_their_addresses():
    buffers = DeviceBuffers("cpu", {"slots": 16, "thresholds": 4})
    with counting(torch.nn.Module()) as census:
        sent = buffers.send({"slots": [3, 1, 2], "thresholds": Floats([0.5, 0.1]), "empty": []})
    assert census.segments[0].host_to_device == 1, census.segments[0].copies
    assert sent["slots"].tolist() == [3, 1, 2] and sent["empty"].numel() == 0
    assert sent["thresholds"].dtype == torch.float64 and sent["thresholds"].tolist() == [0.5, 0.1]
    before = buffers.addresses()  # "empty" was new: the regions moved to a buffer with room for it
    again = buffers.send({"slots": list(range(16)), "thresholds": Floats([0.25])})
    assert buffers.growths == 0 and buffers.addresses() == before
    assert (
        again["slots"].data_ptr() == before["slots"]
        and again["thresholds"].data_ptr() == before["thresholds"]
    )
    assert again["slots"].tolist() == list(range(16)) and again["thresholds"].tolist() == [0.25]


def test_a_list_longer_than_its_region_grows_it_once_geometrically():
    buffers = DeviceBuffers("cpu", {"tokens": 8})
    grown = buffers.send({"tokens": list(range(9))})
    assert buffers.growths == 1 and buffers.capacity["tokens"] >= 16
    assert grown["tokens"].tolist() == list(range(9))
    assert buffers.send({"tokens": list(range(16)), "new": [1]})["tokens"].tolist() == list(range(16))
    assert buffers.growths == 1  # fits its grown region (a new region moves the buffer, not a growth)
    settled = buffers.addresses()
    buffers.send({"tokens": [7] * 12, "new": [2, 3]})
    assert buffers.growths == 1 and buffers.addresses() == settled


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return {spec: load_model(spec) for spec in FAMILIES}


def _decoding(loaded):
    decoding = decoding_for(loaded)
    return (
        decoding if loaded.family.kind.canvas_rows else replace(decoding, block_length=8, steps_per_block=8)
    )


def _buffers(runner) -> DeviceBuffers:
    stepper = runner.stepper
    return stepper.buffers if hasattr(stepper, "buffers") else stepper.pool.buffers


def _set_buffers(runner, buffers: DeviceBuffers) -> None:
    stepper = runner.stepper
    if hasattr(stepper, "buffers"):
        stepper.buffers = buffers
    else:
        stepper.pool.buffers = buffers


def _cycle(lengths: list[int], tag: str) -> SchedulerOutput:
    rows = [CycleRow(tuple(range(3, 3 + n)), owner=f"{tag}-{i}") for i, n in enumerate(lengths)]
    return SchedulerOutput.of_rows(rows, packed=True)


class SendSpy:
    """Every send's buffers and each region's address (regions that received something)."""

    def __init__(self, monkeypatch) -> None:
        self.sends: list[tuple[DeviceBuffers, dict[str, int]]] = []
        original = DeviceBuffers.send

        def send(buffers, parts):
            sent = original(buffers, parts)
            self.sends.append((buffers, {name: t.data_ptr() for name, t in sent.items() if t.numel()}))
            return sent

        monkeypatch.setattr(DeviceBuffers, "send", send)

    def moved(self, buffers: DeviceBuffers) -> list[str]:
        """What a runner whose lists all go to ``buffers`` at fixed addresses never shows: a send into other
        buffers, or a region away from its address."""
        problems = [f"a send into buffers of its own ({list(p)})" for b, p in self.sends if b is not buffers]
        addresses = buffers.addresses()
        return problems + [
            f"{name} at {ptr:#x}, not {addresses[name]:#x}"
            for b, parts in self.sends
            if b is buffers
            for name, ptr in parts.items()
            if ptr != addresses[name]
        ]


def _two_cycles(loaded, monkeypatch) -> tuple[SendSpy, DeviceBuffers]:
    runner = make_runner(loaded, _decoding(loaded), pool_tokens=1 << 12)
    spy = SendSpy(monkeypatch)
    runner.run(_cycle([5, 19, 11], "a"))
    runner.run(_cycle([27, 2], "b"))  # other rows, fewer of them, other lengths
    return spy, _buffers(runner)


@pytest.mark.parametrize("spec", FAMILIES)
def test_every_region_keeps_its_address_across_cycles_of_different_rows(models, spec, monkeypatch):
    spy, buffers = _two_cycles(models[spec], monkeypatch)
    assert len(spy.sends) >= 2 and buffers.growths == 0
    assert spy.moved(buffers) == []


def test_the_address_check_sees_buffers_made_afresh_each_cycle(models, monkeypatch):
    """A planted defect: the buffer allocated anew at every send, as a fresh tensor per cycle would be."""
    original = DeviceBuffers.send

    def fresh(buffers, parts):
        buffers._allocate(dict(buffers.capacity))
        return original(buffers, parts)

    monkeypatch.setattr(DeviceBuffers, "send", fresh)
    spy, buffers = _two_cycles(models["random:llada-tiny"], monkeypatch)
    assert spy.moved(buffers)


@pytest.mark.parametrize("spec", FAMILIES)
def test_a_cycle_larger_than_the_regions_grows_them_and_gives_a_fresh_runners_tokens(models, spec):
    loaded = models[spec]
    small = make_runner(loaded, _decoding(loaded), pool_tokens=1 << 12)
    _set_buffers(small, DeviceBuffers(loaded.device, dict.fromkeys(_buffers(small).capacity, 1)))
    fresh = make_runner(loaded, _decoding(loaded), pool_tokens=1 << 12)
    first = small.run(_cycle([30, 9, 17, 4], "a"))
    assert _buffers(small).growths >= 1
    expected = fresh.run(_cycle([30, 9, 17, 4], "a"))
    assert (first.blocks, first.steps) == (expected.blocks, expected.steps)
    growths, addresses = _buffers(small).growths, _buffers(small).addresses()
    again = small.run(_cycle([30, 9, 17, 4], "b"))  # the same lists' sizes: they fit now
    assert (_buffers(small).growths, _buffers(small).addresses()) == (growths, addresses)
    expected = fresh.run(_cycle([30, 9, 17, 4], "b"))
    assert (again.blocks, again.steps) == (expected.blocks, expected.steps)
