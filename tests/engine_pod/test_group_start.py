"""A tensor-parallel group waits long while it starts (ranks of a multi-node group start and load minutes
apart) and its collective timeout once it runs: two real gloo processes, a collective timeout of 1 s, and a
leader that keeps the other rank waiting 2.5 s before and after the group starts."""

from __future__ import annotations

import multiprocessing
import time

import torch

from engine_pod.parallel.group import GroupFailed, free_address, join_group, leave_group

TIMEOUT_S, LATE_S = 1.0, 2.5


def _rank(rank: int, address: str, results) -> None:
    parallel = join_group(rank, 2, address, torch.device("cpu"), timeout_s=TIMEOUT_S)
    try:
        if rank == 0:
            time.sleep(LATE_S)  # loading its shard, say
        results.put(("starting", rank, parallel.broadcast("runner")))
        parallel.started()
        if rank == 0:
            time.sleep(LATE_S)  # hung: the other rank must give up within the collective timeout
        began = time.monotonic()
        try:
            parallel.broadcast("run")
            results.put(("running", rank, "answered"))
        except GroupFailed:
            results.put(("running", rank, round(time.monotonic() - began, 1)))
    finally:
        leave_group()


def test_a_late_rank_is_waited_for_while_the_group_starts_and_not_once_it_runs():
    spawn = multiprocessing.get_context("spawn")
    results, address = spawn.Queue(), free_address()
    ranks = [spawn.Process(target=_rank, args=(r, address, results)) for r in (0, 1)]
    for process in ranks:
        process.start()
    seen = [results.get(timeout=120) for _ in range(3)]
    for process in ranks:
        process.join(timeout=60)
        if process.is_alive():
            process.kill()
    assert ("starting", 1, "runner") in seen  # waited 2.5 s for rank 0, past the 1 s timeout
    (waited,) = [value for phase, rank, value in seen if (phase, rank) == ("running", 1)]
    assert isinstance(waited, float) and waited < LATE_S  # gave up within the timeout, not after 2.5 s
