"""The engine installed alone (``pip install .``, no extras): ``dllm generate``, ``profile``, ``bench``,
``eval`` and ``train`` run with only torch and the model libraries, and the GPU script is rehearsed on the
CPU in the same environment.

Neither the lent GPU machine nor an engine-only install has the serving or Kubernetes stacks (redis,
orjson, fastapi, uvicorn, httpx, prometheus_client, pydantic, kopf, kubernetes, ...);
``tests/bare_device/sitecustomize.py`` makes a subprocess look the same by refusing their imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BARE = ROOT / "tests" / "bare_device"
# the small rehearsal's bound: about 200 s in the suite on two busy cores here, so a machine three times
# slower still passes (the suite's per-test default, 480 s, would not hold it)
REHEARSAL_LIMIT_S = 1200


def _bare_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=f"{BARE}{os.pathsep}{ROOT}", DLLM_TEST_THREADS="1", **extra)
    env.pop("PYTHONSTARTUP", None)
    return env


def _run(args: list[str], timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=ROOT, env=_bare_env(**extra), capture_output=True, text=True, timeout=timeout, check=False
    )


def _dllm(*args: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "engine_pod.cli.main", *args])


SERVING_STACK = ["redis", "orjson", "fastapi", "uvicorn", "httpx", "prometheus_client", "kopf", "kubernetes"]


@pytest.mark.parametrize("package", [*SERVING_STACK, "pydantic"])
def test_the_bare_environment_really_lacks_the_serving_stack(package):
    result = _run([sys.executable, "-c", f"import {package}"])
    assert result.returncode != 0 and "blocked" in result.stderr


@pytest.mark.parametrize("command", ["generate", "profile", "bench", "eval", "train", "worker", "serve"])
def test_every_command_loads_without_the_serving_stack(command):
    """Each subcommand imports what it needs when it runs: the CLI itself loads none of the serving
    stack, so even the serving commands explain themselves."""
    result = _dllm(command, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage: dllm " + command in result.stdout


def test_dllm_help_and_generate_run_without_the_serving_stack():
    assert _dllm("--help").returncode == 0
    result = _dllm("generate", "--prompt", "letters from t to z .", "--chat", "--canvas", "block")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "t u v w x y z"


def test_eval_and_train_run_without_the_serving_stack(tmp_path):
    """(``profile`` and ``bench`` run in the rehearsal of the GPU script below.)"""
    evaluated = _dllm("eval", "--n", "2", "--policy", "sequential", "--max-tokens", "32", "--json")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "sequential" in json.loads(evaluated.stdout)["policies"]
    trained = _dllm("train", "--steps", "1", "--threads", "1", "--out", str(tmp_path / "run"))
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoint" / "config.json").is_file()


def test_serving_commands_say_what_is_missing_in_one_line():
    result = _dllm("worker", "--redis", "redis://127.0.0.1:1/0", "--service", "s")
    assert result.returncode != 0
    last = result.stderr.splitlines()[-1]
    assert "blocked" in last and "dllm-serve[serve]" in last


def _rehearse(out: Path, timeout: int, step_timeout: int, **sizes: str) -> subprocess.CompletedProcess:
    """``scripts/gpu-bench.sh`` on the CPU in the bare environment: the random models of the real shapes in
    float32 under a 600 MiB limit, at the ``sizes`` given. The script's own step limits fit a GPU lease; on a
    loaded CPU the rehearsal waits for its steps up to ``step_timeout`` (``timeout`` only ends a hang)."""
    steps = str(step_timeout)
    return _run(
        ["bash", "scripts/gpu-bench.sh", str(out)],
        timeout=timeout,
        PROFILE_TIMEOUT=steps,
        BENCH_TIMEOUT=steps,
        PYTHON=sys.executable,
        DEVICE="cpu",
        MODEL="random:llada-tiny",
        DTYPE="float32",
        MEMORY_LIMIT="600M",
        BLOCK_MODEL="random:llada2-tiny",
        CYCLE_ROWS="4",
        CYCLE_WIDTH="40",
        CYCLE_REPEATS="1",
        CYCLE_STEPS="2",  # a cycle of the random model's vocabulary is seconds a forward on one CPU thread
        **sizes,
    )


@pytest.mark.timeout(REHEARSAL_LIMIT_S)
def test_gpu_bench_script_runs_every_step_in_the_bare_environment_at_a_small_size(tmp_path):
    """CI's rehearsal of the GPU script: every step (device, profile, bench, fixed-steps bench, summary, the block
    model's profile and bench), at a size one CPU thread runs in about a minute alone (three under the
    suite's other processes), with two of the four policies. The full-size rehearsal below, every policy,
    is behind the slow marker."""
    result = _rehearse(
        tmp_path,
        REHEARSAL_LIMIT_S - 60,
        REHEARSAL_LIMIT_S - 120,
        POLICY="blockserve,static",  # one process per policy: two here, all four in the full rehearsal
        MAX_TOKENS="384",  # the smallest grid with two token counts to fit: four shapes
        WORKLOAD="synthetic:n=2,prompt=8-40,gen=32-32,seed=0",
        BLOCK_MAX_TOKENS="384",
        BLOCK_WORKLOAD="synthetic:n=2,prompt=8-30,gen=32-32,seed=0",
        SPARSE_REQUESTS="4",
    )
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    for name in ("device.txt", "profile.json", "bench.json", "bench-fixed.json", "summary.txt"):
        assert (tmp_path / name).is_file(), name
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert len(files) <= 8, files  # what one device lease brings back
    fixed = json.loads((tmp_path / "bench-fixed.json").read_text())
    assert (fixed["decoding"]["remasking"], fixed["decoding"]["steps_per_block"]) == ("low_confidence", 32)
    both = {f"{policy}/batch-invariant-{on}" for policy in ("blockserve", "static") for on in ("on", "off")}
    assert set(fixed["policies"]) == both  # each policy with --batch-invariant and without
    assert fixed["policies"]["blockserve/batch-invariant-on"]["vs_batch_invariant_off"] > 0
    cycle_profile = (tmp_path / "cycle-profile.txt").read_text()
    assert "layout packed" in cycle_profile and "layout dense" in cycle_profile, cycle_profile
    assert cycle_profile.count("operators dispatched") == 2, cycle_profile
    assert set(json.loads((tmp_path / "bench.json").read_text())["policies"]) == {"blockserve", "static"}
    assert set(json.loads((tmp_path / "llada2" / "bench-fixed.json").read_text())["policies"]) == {
        "blockserve",
        "static",
    }
    assert "bench: policies measured blockserve, static" in result.stdout
    summary = (tmp_path / "summary.txt").read_text()  # one memory limit, dense and sparse caches
    for run in ("blockserve:dense", "dllm-serve:dense", "dllm-serve:uniform@0.5", "dllm-serve:uniform@0.3"):
        assert f"\n{run} " in summary, summary
    assert "rows mean" in summary


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("gpu-bench")
    result = _rehearse(
        out,
        3600,
        3000,
        POLICY="static,blockserve,blockserve-dense,sequential",  # the default three and sequential
        MAX_TOKENS="2048",
        WORKLOAD="synthetic:n=12,prompt=8-100,gen=32-96,seed=0",
        BLOCK_MAX_TOKENS="1024",
        BLOCK_WORKLOAD="synthetic:n=6,prompt=8-60,gen=32-64,seed=0",
    )
    return result, out


@pytest.mark.slow  # the whole GPU script on one CPU thread: over CI's time for one test
def test_gpu_bench_script_rehearsed_on_the_cpu_writes_every_result(rehearsal):
    result, out = rehearsal
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    for name in ("device.txt", "profile.json", "bench.json", "bench-fixed.json", "summary.txt"):
        assert (out / name).is_file(), name
    for name in ("profile.json", "bench-fixed.json"):  # the block-diffusion step
        assert (out / "llada2" / name).is_file(), name
    assert set(json.loads((out / "llada2" / "bench-fixed.json").read_text())["policies"]) == {
        "blockserve",
        "static",
    }
    summary = (out / "summary.txt").read_text()
    for text in ("token budget", "usable memory", "peak/usable", "agreement", "calibrated"):
        assert text in summary
    assert [
        line.split()[0]
        for line in summary.splitlines()
        if line.split()[0] in ("blockserve", "blockserve-dense", "static", "sequential")
    ][:4] == ["static", "blockserve", "blockserve-dense", "sequential"]  # then the fixed-steps runs


@pytest.mark.slow  # the whole GPU script on one CPU thread: over CI's time for one test
def test_the_rehearsed_profile_checked_its_budget_under_the_limit(rehearsal):
    _, out = rehearsal
    profile = json.loads((out / "profile.json").read_text())
    check = profile["budget_checks"][-1]
    assert check["under_limit"] and check["budget"] == profile["token_budget"]
    assert (
        check["tokens"] <= profile["token_budget"]
        and check["measured_bytes"] <= profile["usable_memory_bytes"]
    )


@pytest.mark.slow  # the whole GPU script on one CPU thread: over CI's time for one test
def test_with_a_calibrated_threshold_random_weights_finish_blocks_early(rehearsal):
    _, out = rehearsal
    bench = json.loads((out / "bench.json").read_text())
    assert bench["threshold_calibration"]["fraction"] == 0.5
    assert bench["decoding"]["threshold"] == bench["threshold_calibration"]["threshold"] < 0.9
    steps = bench["decoding"]["steps_per_block"]
    sequential = bench["timelines"]["sequential"]  # one row per cycle: forwards = that block's steps
    forwards = [cycle["forwards"] for cycle in sequential]
    assert sum(forwards) / len(forwards) < steps / 2, forwards  # uncalibrated, every block takes all 32
    assert sum(f < steps for f in forwards) > len(forwards) / 2, forwards
    assert len(set(forwards)) > 2, "blocks should need different numbers of steps"
    assert bench["outputs_identical"]
