"""``dllm bench --clock engine-cpu``: an online run timed by the engine's own CPU seconds, the idle time to
the next arrival skipped (never slept), so arrivals minutes apart take the engine's work, not minutes."""

from __future__ import annotations

import json
import time

import pytest

from engine_pod.bench.online import Load
from engine_pod.bench.run_clock import RunClock
from engine_pod.cli.main import main


def test_the_engine_clock_skips_idle_time_and_counts_cpu_seconds():
    clock = RunClock("engine-cpu")
    clock.wait_until(100.0)
    assert 100.0 <= clock.now() < 101.0
    began, spin = clock.now(), time.process_time()
    while time.process_time() - spin < 0.05:  # CPU work advances it
        pass
    assert clock.now() - began >= 0.05
    wall = RunClock("wall")
    wall.wait_until(0.05)  # slept on the wall's clock
    assert wall.now() >= 0.05
    with pytest.raises(ValueError, match="unknown clock"):
        RunClock("cpu")


def test_an_online_bench_on_the_engine_clock_never_sleeps_and_reports_its_clock(
    tmp_path, monkeypatch, capsys
):
    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"slept {seconds:.1f} s on the engine's clock")

    monkeypatch.setattr(time, "sleep", no_sleep)
    rate = 0.01  # arrivals about 100 s apart: minutes of idle time, skipped
    offsets = Load(rate=rate).arrival_offsets(3)
    out = tmp_path / "bench.json"
    argv = [
        "bench", "--model", "random:llada2-tiny", "--threads", "1", "--no-isolate", "--policy", "blockserve",
        "--workload", "synthetic:n=3,prompt=8-24,gen=32-32,seed=0", "--arrival-rate", str(rate),
        "--clock", "engine-cpu", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["clock"] == "engine-cpu"
    assert "timed by the engine's CPU seconds" in capsys.readouterr().out
    (run,) = report["runs"]["blockserve"].values()
    assert run["requests"] == 3
    # the run spans its arrivals on the engine's clock, and each request's latency is its own work
    assert run["wall_s"] >= offsets[-1] - offsets[0]
    assert 0 < run["latency_s"]["p99"] < offsets[1] - offsets[0]
    assert run["queue_wait_s"]["p50"] >= 0


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ([], "times online loads"),
        (["--arrival-rate", "4", "--threads", "2"], "add --threads 1"),
        (["--arrival-rate", "4", "--threads", "1", "--policy", "blockserve,gateway"], "--policy gateway"),
    ],
)
def test_the_engine_clock_is_refused_where_it_cannot_time_the_run(extra, error, capsys):
    argv = ["bench", "--model", "random:llada2-tiny", "--clock", "engine-cpu", *extra]
    assert main(argv) != 0
    assert error in capsys.readouterr().err
