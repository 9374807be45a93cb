"""A tensor-parallel group waits long while it starts (ranks of a multi-node group start and load minutes
apart); once it runs, a rank waits for another however long that one computes, and gives up within the
collective timeout once no other rank makes progress. Two real gloo processes (rank 1 the test's own), a
collective timeout of 2 s, and a leader that keeps the other rank waiting 5 s before the group starts, and
after it either sleeping (no progress: a hung rank) or computing (a slow one)."""

from __future__ import annotations

import multiprocessing
import queue
import time

import pytest
import torch

from engine_pod.parallel.group import GroupFailed, free_address, join_group, leave_group

# a collective timeout of 2 s: with 1 s, a suite run on two loaded cores once saw a second with no progress
# while rank 0 computed (its share of the CPU and the store it holds both starved); the product's is 30 s
TIMEOUT_S, LATE_S = 2.0, 5.0
WAIT_S = 120  # a bound on every wait for the ranks, however slow the machine


def _compute_for(seconds: float) -> None:
    """Busy on the CPU for ``seconds`` of wall time (a rank whose share of a batch takes that long)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(10_000))


def _rank(rank: int, address: str, late: str, results) -> None:
    parallel = join_group(rank, 2, address, torch.device("cpu"), timeout_s=TIMEOUT_S)
    try:
        if rank == 0:
            time.sleep(LATE_S)  # loading its shard, say
        results.put(("starting", rank, parallel.broadcast("runner")))
        parallel.started()
        if rank == 0:
            (time.sleep if late == "sleeping" else _compute_for)(LATE_S)
        began = time.monotonic()
        try:
            parallel.broadcast("run")
            results.put(("running", rank, "answered"))
        except GroupFailed:
            results.put(("running", rank, round(time.monotonic() - began, 1)))
    finally:
        leave_group()


def _seen(late: str) -> list[tuple]:
    """What each rank saw: rank 0 spawned (the late one), rank 1 this process (one torch import fewer)."""
    spawn = multiprocessing.get_context("spawn")
    results, address = spawn.Queue(), free_address()
    leader = spawn.Process(target=_rank, args=(0, address, late, results))
    leader.start()
    try:
        here: queue.Queue = queue.Queue()
        _rank(1, address, late, here)
        return [here.get_nowait() for _ in range(2)] + [results.get(timeout=WAIT_S) for _ in range(2)]
    finally:
        leader.join(timeout=WAIT_S)
        if leader.is_alive():
            leader.kill()


def test_a_late_rank_is_waited_for_while_the_group_starts_and_not_once_it_runs_and_stopped():
    seen = _seen("sleeping")
    assert ("starting", 1, "runner") in seen  # waited 5 s for rank 0, past the 2 s timeout
    (waited,) = [value for phase, rank, value in seen if (phase, rank) == ("running", 1)]
    assert isinstance(waited, float) and waited < LATE_S  # gave up within the timeout, not after 5 s


@pytest.mark.parametrize("late", ["computing"])
def test_a_rank_computing_longer_than_the_timeout_is_waited_for_once_the_group_runs(late):
    """A slower machine, or a rank whose experts drew more of a large batch: its progress keeps the others
    waiting past the timeout, and the group goes on."""
    seen = _seen(late)
    assert ("running", 1, "answered") in seen and ("running", 0, "answered") in seen, seen
