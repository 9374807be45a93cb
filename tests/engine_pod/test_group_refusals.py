"""A group the model cannot be spread over, or whose ranks cannot hold their shares, is refused in one line
before any rank starts: the real `dllm generate` in its own process (a group that spawned its ranks would
print the error once per rank), and the memory check counting every rank on the machine against it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from engine_pod.cli.main import main

TIMEOUT_S = 300  # a bound on a whole command, however slow the machine
GIB = 1 << 30


def _generate(*flags: str, limit_as: int | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "engine_pod.cli.main", "generate", "--prompt-ids", "1,2,3", *flags]
    limit = None
    if limit_as is not None:

        def limit() -> None:  # ulimit -v, in the child only
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    return subprocess.run(
        command, capture_output=True, text=True, timeout=TIMEOUT_S, env=os.environ.copy(), preexec_fn=limit
    )


def _one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            ["--model", "random:llada2-tiny", "--tensor-parallel", "8"],
            "--tensor-parallel 8 does not divide the model: 4 heads",
        ),
        (
            ["--model", "random:llada2-tiny", "--tensor-parallel", "0"],
            "--tensor-parallel must be at least 1, got 0",
        ),
        (
            ["--model", "random:llada2-tiny", "--expert-parallel", "0"],
            "--expert-parallel must be at least 1, got 0",
        ),
        (
            ["--model", "random:llada2-tiny", "--expert-parallel", "3"],
            "--expert-parallel 3 does not divide the model's 16 experts",
        ),
        (
            ["--model", "random:llada2-tiny", "--tensor-parallel", "2", "--expert-parallel", "4"],
            "--expert-parallel 4 must divide --tensor-parallel 2",
        ),
        (
            ["--model", "random:llada-tiny", "--expert-parallel", "2"],
            "--expert-parallel 2: LLaDA has no experts to spread (expert parallelism is for LLaDA2.0 and "
            "DiffusionGemma)",
        ),
    ],
)
def test_sizes_that_make_no_group_are_refused_in_one_line_before_any_rank_starts(flags, said):
    line = _one_line(_generate(*flags))
    assert said in line, line
    assert "--nodes" not in line and "rank 1" not in line, line


def test_ranks_that_share_a_machine_are_judged_together_against_it():
    """Under `ulimit -v 4194304` LLaDA-8B at two ranks (15 GiB each in float32) is refused before any
    rank starts: by the address space a process may use, or by the machine's memory the two shares
    need together, whichever is less."""
    line = _one_line(_generate("--model", "random:llada-8b", "--tensor-parallel", "2", limit_as=4 * GIB))
    assert "the model's weights need 14.9 GiB in float32" in line, line
    assert "ulimit -v" in line or "on each of the 2 ranks on this machine, 29.9 GiB together" in line, line


def test_two_ranks_are_refused_where_one_share_fits_but_both_do_not(monkeypatch, capsys):
    """The machine holds one rank's share and not two: refused, counting both."""
    monkeypatch.setattr("engine_pod.device_memory.total_memory", lambda device: 20 * GIB)
    argv = ["generate", "--model", "random:llada-8b", "--tensor-parallel", "2", "--prompt-ids", "1,2,3"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "on each of the 2 ranks on this machine, 29.9 GiB together, more than the 20.0 GiB" in err[0]
    assert "ranks on one machine share its memory" in err[0]


def test_a_cpu_refusal_does_not_advise_more_ranks_on_the_same_machine(monkeypatch, capsys):
    monkeypatch.setattr("engine_pod.device_memory.total_memory", lambda device: GIB)
    assert main(["generate", "--model", "random:llada2-mini", "--prompt-ids", "1,2,3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than the 1.0 GiB of memory on cpu" in err[0], err
    assert "--tensor-parallel" not in err[0] and "more of them do not help" in err[0], err
