"""Torch threads on the product path: real ``dllm generate`` processes under ``taskset`` choose one thread
fewer than their CPUs (at least one), ``DLLM_THREADS`` and ``--threads`` override it, a bad value ends
with one line; ``dllm bench`` states its threads; ``dllm serve`` hands ``--threads`` to its worker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from dllm_contracts.engine_env import THREADS_ENV
from dllm_contracts.model_identity import ModelIdentity
from engine_pod.cli.main import build_parser, main
from engine_pod.cli.serve import _worker_args
from tests.factories import REFERENCE_DIR

LLADA = REFERENCE_DIR / "llada"
IDENTITY = ModelIdentity("tiny-llada", "0123456789abcdef")
CORES = sorted(os.sched_getaffinity(0))
needs_taskset = pytest.mark.skipif(shutil.which("taskset") is None, reason="needs util-linux taskset")


def _generate(
    cores: list[int], *flags: str, env: dict[str, str] | None = None, verbose: bool = False
) -> subprocess.CompletedProcess:
    """``dllm generate --json`` on the given cores, with ``env`` as its only DLLM_THREADS setting
    (``verbose``: with ``-v``, which logs why it chose its threads)."""
    environ = {k: v for k, v in os.environ.items() if k != THREADS_ENV} | (env or {})
    argv = ["taskset", "-c", ",".join(map(str, cores)), sys.executable, "-m", "engine_pod.cli.main"]
    argv += ["-v"] if verbose else []
    argv += ["generate", "--model", str(LLADA), "--prompt-ids", "1,2,3", "--gen-length", "32", *flags]
    return subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=300)


def _threads_of(done: subprocess.CompletedProcess) -> int:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["torch_threads"]


@needs_taskset
def test_one_core_runs_one_thread_and_the_variable_or_the_flag_override_it():
    assert _threads_of(_generate(CORES[:1], "--json")) == 1
    assert _threads_of(_generate(CORES[:1], "--json", env={THREADS_ENV: "2"})) == 2
    assert _threads_of(_generate(CORES[:1], "--json", "--threads", "2", env={THREADS_ENV: "3"})) == 2


@needs_taskset
@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")
def test_two_cores_one_of_them_busy_run_one_thread_where_torch_would_run_two():
    spinner = subprocess.Popen(["taskset", "-c", str(CORES[1]), sys.executable, "-c", "while True: pass"])
    try:
        done = _generate(CORES[:2], "--json", verbose=True)
    finally:
        spinner.kill()
        spinner.wait()
    assert _threads_of(done) == 1
    assert "torch threads: 1 (2 CPUs usable: affinity 2, cgroup quota none, " in done.stderr


@needs_taskset
@pytest.mark.parametrize(
    "flags, env, refused",
    [(["--threads", "0"], None, "--threads must be a positive integer, got '0'"),
     ([], {THREADS_ENV: "many"}, f"{THREADS_ENV} must be a positive integer, got 'many'")],
)  # fmt: skip
def test_a_bad_thread_count_ends_with_one_line_naming_it(flags, env, refused):
    done = _generate(CORES[:1], *flags, env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"dllm generate: error: {refused}"]


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_bench_states_its_threads_in_the_report_and_the_summary(tmp_path, capsys, restore_threads):
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", str(LLADA), "--workload", "synthetic:n=2,prompt=4-8,gen=8,seed=0"]
    argv += ["--policy", "blockserve", "--block-length", "8", "--no-isolate", "--threads", "2"]
    assert main([*argv, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["torch_threads"]["threads"] == 2
    assert "torch threads 2 (--threads 2;" in capsys.readouterr().out
    assert main([*argv, "--pin"]) == 2  # --pin runs one thread on one core: another count is refused
    assert "--threads: --pin runs the engine on one core" in capsys.readouterr().err


def test_serve_hands_its_threads_to_the_worker():
    parser = build_parser()
    given = parser.parse_args(["serve", "--threads", "3", "--token-budget", "4096"])
    given.service = "default"
    args = _worker_args(given, "redis://127.0.0.1:1/0", IDENTITY)
    assert args[args.index("--threads") + 1] == "3"
