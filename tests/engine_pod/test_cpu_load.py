"""torch threads follow the load after start (engine_pod/cpu_load.py): between block cycles the engine looks
again, lowers its count when another process keeps one of its CPUs busy and raises it once that stops; a
pinned count, or one something else set since, is left alone; a spawned benchmark child follows too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine_pod import cpu_load
from engine_pod.cpu_load import LoadSampler, ThreadFollower, apply_threads, follow_load, following
from engine_pod.cpu_threads import FollowLoad
from engine_pod.decoding.config import DecodingConfig
from engine_pod.generation import generate_one
from engine_pod.isolation import run_in_child
from engine_pod.loading.loader import load_model

CORES = sorted(os.sched_getaffinity(0))
TWO = FollowLoad(frozenset(CORES[:2]), None)
LOOKS = 200  # how many looks a wait for the count to change may take (each after at least one cycle)


class _Stat:
    """A /proc/stat of two CPUs whose busy ticks the test sets, a clock and this process's CPU time."""

    def __init__(self, path: Path) -> None:
        self.path, self.ticks, self.busy, self.now_s, self.own_s = path, [0, 0], [0, 0], 0.0, 0.0
        self.advance(0.0, 0.0)

    def advance(self, busy0: float, busy1: float) -> None:
        """A second passes (100 ticks on each CPU), the given share of each CPU busy."""
        self.now_s += 1.0
        self.ticks = [self.ticks[0] + 100, self.ticks[1] + 100]
        self.busy = [self.busy[0] + int(100 * busy0), self.busy[1] + int(100 * busy1)]
        lines = ["cpu  0 0 0 0 0 0 0 0"]
        for cpu in (0, 1):  # user nice system idle iowait irq softirq steal
            lines.append(f"cpu{cpu} {self.busy[cpu]} 0 0 {self.ticks[cpu] - self.busy[cpu]} 0 0 0 0")
        self.path.write_text("\n".join(lines) + "\n")


def _follower(stat: _Stat, threads: int, reserve: int = 0):
    clock = iter(range(1, 10_000))
    state = {"threads": threads}
    follower = ThreadFollower(
        FollowLoad(frozenset({0, 1}), None, reserve),
        threads,
        sampler=LoadSampler(frozenset({0, 1}), stat.path, own=lambda: stat.own_s, clock=lambda: stat.now_s),
        clock=lambda: next(clock),
        set_threads=lambda n: state.update(threads=n),
        get_threads=lambda: state["threads"],
    )
    return follower, state


def test_the_count_goes_down_while_a_cpu_is_kept_busy_and_up_again_after(tmp_path):
    stat = _Stat(tmp_path / "stat")
    follower, state = _follower(stat, threads=2)
    stat.advance(0.1, 0.2)  # a little background
    follower.between_cycles()
    assert state["threads"] == 2
    stat.advance(0.3, 1.0)  # another process keeps CPU 1 busy
    follower.between_cycles()
    assert state["threads"] == 1
    stat.advance(1.0, 1.0)  # both busy: never fewer than one
    stat.own_s += 1.0  # half of it is this process's own
    follower.between_cycles()
    assert state["threads"] == 1
    stat.advance(0.0, 0.1)  # the neighbour stopped
    follower.between_cycles()
    assert state["threads"] == 2 and follower.changes == 2


def test_a_reserved_cpu_stays_reserved_and_a_count_set_by_someone_else_is_theirs(tmp_path):
    stat = _Stat(tmp_path / "stat")
    follower, state = _follower(stat, threads=1, reserve=1)
    stat.advance(0.0, 0.0)
    follower.between_cycles()
    assert state["threads"] == 1  # two CPUs, one kept for the gateway and Redis
    follower, state = _follower(stat, threads=1)
    state["threads"] = 3  # a tensor-parallel rank's share, say
    stat.advance(0.0, 0.0)
    follower.between_cycles()
    assert state["threads"] == 3 and follower.changes == 0


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    follow_load(None, before)
    torch.set_num_threads(before)


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")
def test_an_engine_started_on_two_threads_runs_one_once_a_busy_process_appears(restore_threads):
    """The engine loop itself: ``dllm generate``'s engine, started at two threads, lowers its count between
    block cycles once a real busy loop takes one of its two CPUs (a loaded machine may lower it sooner)."""
    loaded = load_model("builtin:tiny-llada")
    torch.set_num_threads(2)
    follow_load(TWO, 2)
    generate_one(loaded, [1, 2, 3], 32, DecodingConfig())  # started: cycles run on two threads
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {CORES[1]})
        for _ in range(LOOKS):
            if torch.get_num_threads() == 1:
                break
            generate_one(loaded, [1, 2, 3], 32, DecodingConfig())
    finally:
        spinner.kill()
        spinner.wait()
    assert torch.get_num_threads() == 1
    assert cpu_load._follower["engine"].changes >= 1


def test_a_pinned_count_never_follows_and_a_default_one_reaches_a_spawned_child(restore_threads):
    pinned = apply_threads("1")
    assert not pinned.follow and following() is None and run_in_child(following) is None
    chosen = apply_threads(None)  # no --threads, DLLM_THREADS unset below
    assert chosen.follow is not None and following() == chosen.follow
    assert run_in_child(following) == chosen.follow  # a benchmark's child follows as its parent would


@pytest.fixture(autouse=True)
def _no_threads_variable(monkeypatch):
    monkeypatch.delenv("DLLM_THREADS", raising=False)
