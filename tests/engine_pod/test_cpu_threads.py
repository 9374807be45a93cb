"""The CPUs a process may use (affinity, cgroup v1 and v2 quotas) and the torch threads chosen from them:
the flag over ``DLLM_THREADS`` over the default; children of ``run_in_child`` keep the parent's choice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dllm_contracts.engine_env import THREADS_ENV
from engine_pod.cpu_threads import UsableCpus, busy_elsewhere, cgroup_cpu_quota, choose_threads, usable_cpus
from engine_pod.isolation import run_in_child


def _cgroup(root: Path, self_cgroup: str, files: dict[str, str]) -> Path:
    """A fake /sys/fs/cgroup under ``root`` and a /proc/self/cgroup beside it; returns the latter's path."""
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    proc = root.parent / "proc-self-cgroup"
    proc.write_text(self_cgroup)
    return proc


def test_cgroup_v2_quota_is_the_tightest_over_the_cgroup_and_its_ancestors(tmp_path):
    root = tmp_path / "cgroup"
    proc = _cgroup(
        root,
        "0::/kubepods/pod1/engine\n",
        {
            "cpu.max": "max 100000\n",
            "kubepods/pod1/cpu.max": "250000 100000\n",
            "kubepods/pod1/engine/cpu.max": "max 100000\n",
        },
    )
    assert cgroup_cpu_quota(root, proc) == 2.5
    assert usable_cpus(root, proc).quota == 2.5


def test_cgroup_v2_inside_a_container_reads_its_own_root(tmp_path):
    root = tmp_path / "cgroup"  # a cgroup namespace: /proc/self/cgroup says "/", the root is the container's
    proc = _cgroup(root, "0::/\n", {"cpu.max": "150000 100000\n"})
    assert cgroup_cpu_quota(root, proc) == 1.5


def test_no_limit_anywhere_is_no_quota(tmp_path):
    root = tmp_path / "cgroup"
    proc = _cgroup(
        root, "0::/user.slice\n", {"cpu.max": "max 100000\n", "user.slice/cpu.max": "max 100000\n"}
    )
    assert cgroup_cpu_quota(root, proc) is None
    assert cgroup_cpu_quota(tmp_path / "absent", tmp_path / "absent-proc") is None


def test_cgroup_v1_quota_over_period(tmp_path):
    root = tmp_path / "cgroup"
    files = {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    }
    proc = _cgroup(root, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n", files)
    assert cgroup_cpu_quota(root, proc) == 3.0
    files["cpu,cpuacct/docker/abc/cpu.cfs_quota_us"] = "-1\n"
    proc = _cgroup(root, "3:cpu,cpuacct:/docker/abc\n", files)
    assert cgroup_cpu_quota(root, proc) is None


def test_usable_cpus_take_the_affinity_capped_by_the_quota_rounded_up(tmp_path):
    root = tmp_path / "cgroup"
    proc = _cgroup(root, "0::/\n", {"cpu.max": "50000 100000\n"})  # half a CPU
    affinity = len(os.sched_getaffinity(0))
    cpus = usable_cpus(root, proc)
    assert cpus == UsableCpus(affinity, 0.5) and cpus.count == 1 and cpus.default_threads() == 1
    assert UsableCpus(16, 4.2).count == 5 and UsableCpus(16, 4.2).default_threads() == 5
    assert UsableCpus(2, None).count == 2 and UsableCpus(2, None).default_threads() == 2
    assert UsableCpus(3, 8.0).count == 3


def test_a_cpu_others_keep_busy_and_a_reserved_one_get_no_thread():
    assert UsableCpus(2, None, busy=0.3).default_threads() == 2  # a little background: still free
    assert UsableCpus(2, None, busy=0.9).default_threads() == 1  # a core kept busy
    assert UsableCpus(2, None, busy=2.0).default_threads() == 1  # never fewer than one
    assert UsableCpus(8, 6.0, busy=1.6).default_threads() == 4
    assert UsableCpus(2, None).default_threads(reserve=1) == 1  # dllm serve: room for the gateway, Redis


def test_the_cpus_another_process_keeps_busy_are_measured():
    """A process spinning on one of this process's CPUs reads as about one busy CPU."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {cpus[0]})
        busy = busy_elsewhere(set(cpus), 0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy >= 0.6  # its core; on a loaded machine more


def test_the_flag_wins_over_the_variable_which_wins_over_the_default():
    cpus = UsableCpus(8, None, busy=1.0)
    assert choose_threads(None, {}, cpus).threads == 7
    assert choose_threads(None, {THREADS_ENV: "3"}, cpus).threads == 3
    assert choose_threads("5", {THREADS_ENV: "3"}, cpus).threads == 5
    line = choose_threads(None, {}, UsableCpus(2, None)).log_line()
    assert (
        line.startswith("torch threads: 2 (2 CPUs usable: affinity 2, cgroup quota none, 0.0 busy")
        and THREADS_ENV in line
    )
    assert (
        "1 kept for the gateway and Redis" in choose_threads(None, {}, UsableCpus(2, None), reserve=1).reason
    )


@pytest.mark.parametrize(
    "flag, environ, name",
    [("0", {}, "--threads"), ("two", {}, "--threads"), (None, {THREADS_ENV: "-1"}, THREADS_ENV)],
)
def test_a_thread_count_that_is_not_a_positive_integer_is_refused_by_name(flag, environ, name):
    with pytest.raises(ValueError, match=f"^{name} must be a positive integer"):
        choose_threads(flag, environ, UsableCpus(2, None))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_spawned_child_runs_the_parents_torch_threads(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert run_in_child(torch.get_num_threads) == threads
    finally:
        torch.set_num_threads(before)
