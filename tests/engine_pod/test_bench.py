"""`dllm bench`: every policy in one run, the report's fields, output comparison, plots, workloads."""

from __future__ import annotations

import json
import os

import pytest

from dllm_contracts.profile_summary import ProfileSummary
from engine_pod.bench import benchmark
from engine_pod.bench.policies import static_batch_size_for
from engine_pod.bench.workloads import WorkloadError, load_workload, named_workloads
from engine_pod.cli.main import main
from tests.serving_utils import write_served_model

FIELDS = {
    "generated_tokens",
    "wall_s",
    "tokens_per_s",
    "requests_per_s",
    "latency_p50_s",
    "latency_p99_s",
    "padding_efficiency",
    "num_forward_passes",
    "peak_memory_bytes",
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_served_model(tmp_path_factory.mktemp("bench-model"))


def heterogeneous_float64_bench(model, out, limit: int, policies: str) -> list[str]:
    """`dllm bench` argv: the first ``limit`` heterogeneous requests in float64, budget 2048, L = S = 8."""
    return [
        "bench",
        "--model",
        str(model),
        "--dtype",
        "float64",
        "--workload",
        "heterogeneous",
        "--limit",
        str(limit),
        "--policy",
        policies,
        "--token-budget",
        "2048",
        "--block-length",
        "8",
        "--steps-per-block",
        "8",
        "--json",
        str(out),
    ]


def _bench_side_by_side(model, tmp_path, policies: str) -> dict:
    """The policies on the first 16 heterogeneous requests, with the checks every run must pass."""
    out, plot = tmp_path / "b.json", tmp_path / "b.png"
    argv = heterogeneous_float64_bench(model, out, 16, policies) + ["--plot", str(plot)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert set(report["policies"]) == set(policies.split(","))
    for metrics in report["policies"].values():
        assert set(metrics) >= FIELDS and metrics["requests"] == 16
        assert 0 < metrics["padding_efficiency"] <= 1
    # what the speedup comes from, in work rather than time (a timed floor would fail on a busy machine):
    # measured 192 forwards against static's 384, 16 rows against static's 6
    blockserve, static = report["policies"]["blockserve"], report["policies"]["static"]
    assert blockserve["num_forward_passes"] * 1.5 <= static["num_forward_passes"]
    assert blockserve["max_rows"] >= 2 * static["max_rows"]
    assert blockserve["padding_efficiency"] >= 0.97 > 0.8 > static["padding_efficiency"]
    assert blockserve["speedup_vs_static"] == pytest.approx(  # the report rounds it to 3 decimals
        blockserve["tokens_per_s"] / static["tokens_per_s"], rel=1e-2, abs=5e-4
    )
    assert report["policies"]["blockserve"]["max_cost_tokens"] <= 2048
    assert report["static_max_box_tokens"] <= 2048  # equal memory: static's largest box fits the same budget
    assert report["outputs_identical"] is True  # float64: batching cannot change any output
    assert report["timelines"]["blockserve"] and plot.stat().st_size > 10_000
    return report


def test_bench_reports_every_batching_policy_side_by_side(model, tmp_path):
    _bench_side_by_side(model, tmp_path, "static,blockserve,blockserve-projected")


@pytest.mark.slow
def test_bench_reports_one_request_at_a_time_beside_the_batching_policies(model, tmp_path):
    """With ``sequential`` (about two minutes of CI's two cores): 2020 forwards, no padding."""
    report = _bench_side_by_side(model, tmp_path, "sequential,static,blockserve,blockserve-projected")
    sequential, blockserve = report["policies"]["sequential"], report["policies"]["blockserve"]
    assert sequential["padding_efficiency"] == 1.0
    assert blockserve["num_forward_passes"] * 8 <= sequential["num_forward_passes"]


def test_bench_takes_its_budget_from_a_profile(model, tmp_path):
    profile = tmp_path / "profile.json"
    measured = ProfileSummary(
        token_budget=1500,
        device="cpu",
        device_name="cpu",
        dtype="float32",
        total_memory_bytes=8 << 30,
        usable_memory_bytes=1 << 30,
        weights_bytes=8 << 20,
    )
    profile.write_text(measured.to_json())
    out = tmp_path / "b.json"
    argv = [
        "bench",
        "--model",
        str(model),
        "--workload",
        "synthetic:n=6,prompt=4-40,gen=8-16,seed=3",
        "--policy",
        "blockserve",
        "--profile",
        str(profile),
        "--block-length",
        "8",
        "--json",
        str(out),
        "--no-isolate",
    ]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["token_budget"] == 1500 and report["usable_memory_bytes"] == 1 << 30


def test_named_and_synthetic_workloads():
    assert {"heterogeneous", "homogeneous"} <= set(named_workloads())
    heterogeneous = load_workload("heterogeneous")
    prompts = [item.prompt_tokens for item in heterogeneous]
    assert min(prompts) < 15 and max(prompts) > 200  # widely varying prompt lengths
    answers = [len(item.answer.split()) for item in heterogeneous]
    assert min(answers) == 1 and max(answers) > 90  # completions from one token to about three blocks
    synthetic = load_workload("synthetic:n=5,prompt=10-20,gen=32,seed=1")
    assert len(synthetic) == 5 and all(10 <= i.prompt_tokens <= 20 and i.max_tokens == 32 for i in synthetic)
    assert load_workload("synthetic:n=5,seed=1") == load_workload("synthetic:n=5,seed=1")


def test_jsonl_traces_and_bad_workloads(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"prompt": "count from 1 to 3 .", "max_tokens": 32}\n{"prompt_tokens": 50, "max_tokens": 64}\n'
    )
    assert [i.max_tokens for i in load_workload(str(trace))] == [32, 64]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(WorkloadError, match="max_tokens"):
        load_workload(str(tmp_path / "bad.jsonl"))
    with pytest.raises(WorkloadError, match="unknown workload"):
        load_workload("no-such-workload")
    with pytest.raises(WorkloadError, match="unknown option"):
        load_workload("synthetic:size=3")


def test_static_batch_size_fits_the_budget():
    assert static_batch_size_for([100, 100, 100, 100], 250) == 2
    assert static_batch_size_for([100, 300, 100], 600) == 2
    with pytest.raises(ValueError, match="widest request"):
        static_batch_size_for([500], 100)


def test_bench_rejects_unknown_policies(capsys):
    assert main(["bench", "--policy", "fifo", "--json", "/dev/null"]) == 2
    assert "unknown policies" in capsys.readouterr().err


@pytest.mark.slow  # CI runs the gateway policy in the online benchmark below
def test_gateway_policy_runs_the_same_workload_through_the_serving_path(model, tmp_path):
    out = tmp_path / "g.json"
    argv = heterogeneous_float64_bench(model, out, 10, "blockserve,gateway")
    assert main(argv) == 0
    report = json.loads(out.read_text())
    gateway, engine = report["policies"]["gateway"], report["policies"]["blockserve"]
    assert gateway["requests"] == 10
    # behind the queue the worker still batches: rows join at block boundaries as they arrive
    # (measured with 16 requests: all 16 in one batch, 25 block cycles against the engine's 24)
    assert gateway["max_rows"] >= 5 and gateway["block_cycles"] <= 1.5 * engine["block_cycles"]
    assert gateway["throughput_vs_engine"] == pytest.approx(  # the report rounds it to 3 decimals
        gateway["tokens_per_s"] / engine["tokens_per_s"], rel=1e-2, abs=5e-4
    )
    assert report["outputs_identical"] is True  # the same tokens through HTTP, Redis and the worker


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--pin needs two cores")
def test_pinned_bench_runs_the_engine_on_one_core_and_the_serving_path_on_the_others(model, tmp_path):
    out = tmp_path / "pinned.json"
    assert main([*heterogeneous_float64_bench(model, out, 6, "blockserve,gateway"), "--pin"]) == 0
    report = json.loads(out.read_text())
    engine, *serving = sorted(os.sched_getaffinity(0))
    assert report["pinned"] is True and report["outputs_identical"] is True
    assert report["torch_threads"]["threads"] == 1
    assert report["policies"]["blockserve"]["cores"] == {"engine": [engine]}
    assert report["policies"]["gateway"]["cores"] == {
        "worker": [engine],
        "gateway": serving,
        "redis": serving,
        "client": serving,
    }


def _online_bench(model, out, *load: str) -> list[str]:
    """Eight requests (every family of the workload) under each load; the engine-alone runs in this process
    (a run in a process of its own: ``test_bench_online_peak``)."""
    return [
        "bench", "--model", str(model), "--workload", "heterogeneous", "--requests", "8",
        "--policy", "sequential,static,blockserve,gateway", "--token-budget", "2048",
        "--block-length", "8", "--steps-per-block", "8", "--no-isolate", "--json", str(out), *load,
    ]  # fmt: skip


def test_online_bench_runs_every_policy_on_the_same_arrivals(model, tmp_path):
    out, plot = tmp_path / "online.json", tmp_path / "online.png"
    assert main([*_online_bench(model, out, "--arrival-rate", "40,400"), "--plot", str(plot)]) == 0
    report = json.loads(out.read_text())
    assert [load["rate"] for load in report["loads"]] == [40.0, 400.0]
    assert set(report["runs"]) == {"sequential", "static", "blockserve", "gateway"}
    tokens = set()
    for name, by_load in report["runs"].items():
        for label, metrics in by_load.items():
            assert metrics["requests"] == 8, (name, label)
            assert set(metrics["latency_by_family_s"]) == {"count", "needle", "countdown", "letters"}
            assert 0 < metrics["first_block_s"]["p50"] <= metrics["latency_s"]["p99"]
            assert (metrics["queue_wait_s"] is None) == (name == "gateway")
            tokens.add(metrics["generated_tokens"])
    assert len(tokens) == 1, "every policy generates the same tokens for the same requests"
    assert plot.stat().st_size > 0


def test_repeated_rounds_give_every_policy_every_place_in_a_round(model, tmp_path, monkeypatch):
    """With --repeat the policy list runs once per round, each round starting one policy later, so no
    policy always runs in the same place (after the same other policy)."""
    order = []
    real = benchmark.run_policy

    def recording(loaded, decoding, spec, *args, **kwargs):
        order.append(spec.name)
        return real(loaded, decoding, spec, *args, **kwargs)

    monkeypatch.setattr(benchmark, "run_policy", recording)
    out = tmp_path / "r.json"
    policies = "sequential,static,blockserve"
    argv = heterogeneous_float64_bench(model, out, 2, policies) + ["--repeat", "4", "--no-isolate"]
    assert main(argv) == 0
    assert order == [
        *("sequential", "static", "blockserve"),
        *("static", "blockserve", "sequential"),
        *("blockserve", "sequential", "static"),
        *("sequential", "static", "blockserve"),
    ]
    report = json.loads(out.read_text())
    assert {name: len(walls) for name, walls in report["wall_s_per_run"].items()} == {
        "sequential": 4,
        "static": 4,
        "blockserve": 4,
    }


@pytest.mark.slow  # CI: dllm serve's /metrics hold the quota (test_dllm_serve_policy), the engine's test_dllm_serve
def test_bench_runs_dllm_serve_beside_blockserve_and_reports_its_refreshes_within_the_quota(model, tmp_path):
    """Every policy's tokens identical, dllm-serve's steps held to its refresh quota (0.2 of the budget: 409
    positions, the widest request 338), BlockServe's refreshing its batch at once."""
    out = tmp_path / "b.json"
    argv = heterogeneous_float64_bench(model, out, 16, "blockserve,dllm-serve") + ["--refresh-quota", "0.2"]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["outputs_identical"] is True
    staggered, plain = report["policies"]["dllm-serve"], report["policies"]["blockserve"]
    assert staggered["refresh_quota_positions"] == 409 and plain["refresh_quota_positions"] is None
    assert 0 < staggered["peak_refresh_positions"] <= 409 < plain["peak_refresh_positions"]
    assert 0 < staggered["refresh_share"] <= 1


@pytest.mark.slow
def test_online_bench_reports_dllm_serves_refreshes_within_the_quota(model, tmp_path):
    """Under an arrival rate: the in-process engine's refreshes within the quota, the tokens BlockServe's."""
    online = tmp_path / "online.json"
    argv = [*_online_bench(model, online, "--arrival-rate", "400"), "--refresh-quota", "0.2"]
    argv[argv.index("sequential,static,blockserve,gateway")] = "blockserve,dllm-serve"
    assert main(argv) == 0
    runs = json.loads(online.read_text())["runs"]
    figures = runs["dllm-serve"]["rate 400/s"]
    assert 0 < figures["peak_refresh_positions"] <= figures["refresh_quota_positions"] == 409
    assert figures["generated_tokens"] == runs["blockserve"]["rate 400/s"]["generated_tokens"]
