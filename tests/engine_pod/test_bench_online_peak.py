"""``dllm bench`` under an online load runs each engine-alone run in a fresh process of its own on a CPU, so
that each run's peak memory is its own (its imports, weights and engine, as ``dllm profile`` measures a
point), not the bench process's high-water mark, and reports it against the profile's usable memory."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_contracts.profile_summary import ProfileSummary
from engine_pod.bench.online_bench import PEAK_OWN_PROCESS, PEAK_THIS_PROCESS
from engine_pod.cli.main import main
from engine_pod.device_memory import _resident_high_water_mark
from tests.serving_utils import write_served_model

MIB = 1 << 20


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_served_model(tmp_path_factory.mktemp("peak-model"))


def _argv(model, profile, out, *more: str) -> list[str]:
    return [
        "bench", "--model", str(model), "--workload", "synthetic:n=6,prompt=4-40,gen=8-16,seed=3",
        "--policy", "blockserve,dllm-serve", "--arrival-rate", "1000", "--block-length", "8",
        "--threads", "1", "--profile", str(profile), "--json", str(out), *more,
    ]  # fmt: skip


def _profile(path, usable: int) -> None:
    """A measured profile whose limit is 10% above ``usable`` (the share it plans for)."""
    summary = ProfileSummary(
        memory_limit_bytes=int(usable / 0.9),
        token_budget=1024,
        device="cpu",
        device_name="cpu",
        dtype="float32",
        total_memory_bytes=64 << 30,
        usable_memory_bytes=usable,
        weights_bytes=8 << 20,
    )
    path.write_text(summary.to_json())


def test_each_online_run_peaks_in_a_process_of_its_own(model, tmp_path, capsys):
    """This process holds 400 MiB more than any engine run needs: a peak read here would be over the
    usable memory; each run's own process stays under it."""
    ballast = torch.ones(100 * MIB)  # 400 MiB, touched
    del ballast
    usable = _resident_high_water_mark() - 200 * MIB
    profile, out = tmp_path / "profile.json", tmp_path / "online.json"
    _profile(profile, usable)
    assert main(_argv(model, profile, out)) == 0
    report = json.loads(out.read_text())
    assert report["usable_memory_bytes"] == usable and report["memory_limit_bytes"] == int(usable / 0.9)
    for name in ("blockserve", "dllm-serve"):
        run = report["runs"][name]["rate 1000/s"]
        assert run["peak_measure"] == PEAK_OWN_PROCESS, name
        assert 0 < run["peak_memory_bytes"] <= usable, name
        assert run["peak_within_usable"] and run["peak_within_limit"], name
    printed = capsys.readouterr().out
    assert "<= limit" in printed and "<= usable" in printed and f"peak memory: {PEAK_OWN_PROCESS}" in printed


def test_without_isolation_the_peak_is_the_bench_process_and_says_so(model, tmp_path, capsys):
    ballast = torch.ones(100 * MIB)
    del ballast
    usable = _resident_high_water_mark() - 200 * MIB
    profile, out = tmp_path / "profile.json", tmp_path / "online.json"
    _profile(profile, usable)
    assert main(_argv(model, profile, out, "--no-isolate")) == 0
    run = json.loads(out.read_text())["runs"]["blockserve"]["rate 1000/s"]
    assert run["peak_measure"] == PEAK_THIS_PROCESS
    assert run["peak_memory_bytes"] > usable and run["peak_within_usable"] is False
    assert " NO" in capsys.readouterr().out
