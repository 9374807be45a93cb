"""``dllm bench --sparse-cache`` on what the head-sparse cache does not run (a block-diffusion family, tensor
parallelism): refused in one line before any benchmark child starts, as ``dllm generate`` refuses it."""

from __future__ import annotations

import subprocess
import sys

import pytest

DLLM = [sys.executable, "-m", "engine_pod.cli.main"]
BENCH = [*DLLM, "bench", "--policy", "blockserve", "--limit", "2"]
GENERATE = [*DLLM, "generate", "--prompt-ids", "5,6,7", "--gen-length", "8", "--block-length", "8"]


def _refusal(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return lines[0].split(": error: ", 1)[1]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--model", "random:llada2-tiny"], "the head-sparse cache supports LLaDA and Dream"),
        (["--tensor-parallel", "2"], "one process"),
    ],
    ids=["block-diffusion family", "tensor parallelism"],
)
def test_bench_refuses_what_the_sparse_cache_does_not_run_in_one_line_as_generate_does(flags, words):
    sparse = ["--sparse-cache", "uniform", *flags]
    bench = _refusal([*BENCH, *sparse])
    assert words in bench
    generate = _refusal([*GENERATE, *sparse])
    assert words in generate
