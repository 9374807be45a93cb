"""A budget measured at one tensor-parallel size is never used at another: `dllm worker`, `dllm bench` and
`dllm serve` refuse a profile of another size with one line (exit status 2), before any model is looked at
(the model named here does not exist: a command that went on would fail on it, with another line); and
`dllm profile` measures a group on one machine only."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dllm_contracts.profile_summary import ProfileSummary
from engine_pod.cli.main import main

TIMEOUT_S = 120


def _profile(tmp_path, ranks: int) -> str:
    path = tmp_path / f"profile-at-{ranks}.json"
    path.write_text(ProfileSummary.from_spec(4096, tensor_parallel=ranks).to_json())
    return str(path)


@pytest.mark.parametrize(("measured", "running"), [(2, 1), (1, 2), (4, 2)])
def test_dllm_worker_refuses_a_profile_of_another_parallel_size(tmp_path, capsys, measured, running):
    argv = ["worker", "--model", str(tmp_path / "none"), "--redis", "redis://127.0.0.1:1/0", "--service", "s"]
    argv += ["--port", "0", "--threads", "1", "--profile", _profile(tmp_path, measured)]
    argv += ["--tensor-parallel", str(running)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"was measured at --tensor-parallel {measured}" in err[0], err
    assert (
        f"run with --tensor-parallel {measured}, or profile again with --tensor-parallel {running}" in err[0]
    )


def test_dllm_bench_refuses_a_profile_of_another_parallel_size(tmp_path, capsys):
    argv = ["bench", "--model", str(tmp_path / "none"), "--threads", "1", "--json", str(tmp_path / "b.json")]
    assert main([*argv, "--profile", _profile(tmp_path, 2)]) == 2
    assert "was measured at --tensor-parallel 2" in capsys.readouterr().err


def test_a_profile_of_the_same_size_gives_its_budget(tmp_path):
    from engine_pod.cli.main import build_parser
    from engine_pod.cli.scheduling import scheduler_config

    argv = ["worker", "--redis", "redis://x", "--service", "s", "--tensor-parallel", "2"]
    args = build_parser().parse_args([*argv, "--profile", _profile(tmp_path, 2)])
    assert scheduler_config(args).token_budget == 4096


def test_dllm_serve_refuses_a_profile_of_another_parallel_size_before_starting_anything(tmp_path):
    command = [sys.executable, "-m", "engine_pod.cli.main", "serve", "--model", str(tmp_path / "none")]
    command += ["--port", "0", "--data-dir", str(tmp_path / "data"), "--threads", "1"]
    command += ["--profile", _profile(tmp_path, 1), "--tensor-parallel", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=os.environ.copy())
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and "was measured at --tensor-parallel 1" in lines[-1], done.stderr
    assert not (tmp_path / "data").exists()  # nothing started


def test_dllm_profile_refuses_a_group_over_several_machines_in_one_line(tmp_path, capsys):
    argv = ["profile", "--model", str(tmp_path / "none"), "--tensor-parallel", "4", "--nodes", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--nodes 2: dllm profile measures a group on one machine only" in err[0], err


def test_a_profile_of_another_expert_parallel_size_is_refused_and_its_own_gives_its_budget(tmp_path, capsys):
    """The expert-parallel size is part of the size a budget holds at (a rank holds other weights)."""
    path = tmp_path / "profile-ep2.json"
    path.write_text(ProfileSummary.from_spec(4096, tensor_parallel=1, expert_parallel=2).to_json())
    argv = ["worker", "--model", str(tmp_path / "none"), "--redis", "redis://127.0.0.1:1/0", "--service", "s"]
    argv += ["--port", "0", "--threads", "1", "--profile", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "was measured at --tensor-parallel 1 --expert-parallel 2" in err[0], err
    assert err[0].endswith(
        "run with --tensor-parallel 1 --expert-parallel 2, or profile again with --tensor-parallel 1"
    )

    from engine_pod.cli.main import build_parser
    from engine_pod.cli.scheduling import scheduler_config

    args = build_parser().parse_args(
        ["worker", "--redis", "redis://x", "--service", "s", "--expert-parallel", "2", "--profile", str(path)]
    )
    assert scheduler_config(args).token_budget == 4096
