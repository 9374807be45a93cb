"""A group's failure says what happened: a rank that died (its connection closed at once) is told apart from
a rank that stopped answering (no other rank made progress for the timeout), whichever rank it is (rank 0
also holds the group's store, where each rank's progress is counted). Two real gloo processes (the one not
signalled the test's own), real signals (SIGKILL, SIGSTOP) sent by the test, a collective timeout of 3 s."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading

import pytest
import torch

from engine_pod.parallel.group import GroupFailed, free_address, join_group, leave_group

TIMEOUT_S = 3.0
WAIT_S = 120  # a bound on every wait for the ranks, however slow the machine


def _rank(rank: int, address: str, silent: int, results) -> None:
    """Join, start, then make all-reduces until one fails: the rank not signalled reports the failure's line
    (each rank on a queue of its own: a rank killed while it writes to a shared one would leave its lock
    taken)."""
    parallel = join_group(rank, 2, address, torch.device("cpu"), timeout_s=TIMEOUT_S)
    try:
        parallel.broadcast("runner")
        parallel.started()
        parallel.all_reduce(torch.ones(4))
        results.put(("ready", rank, os.getpid()))
        if rank == silent:
            signal.pause()  # until the test kills or stops it
        try:
            parallel.all_reduce(torch.ones(4))  # the other rank never joins this one
            results.put(("failed", rank, "the all-reduce answered"))
        except GroupFailed as exc:
            results.put(("failed", rank, str(exc)))
    finally:
        leave_group()


@pytest.mark.parametrize(("fault", "silent"), [(signal.SIGKILL, 1), (signal.SIGSTOP, 1), (signal.SIGSTOP, 0)])
def test_a_group_failure_says_whether_a_rank_died_or_did_not_answer(fault, silent):
    """The signalled rank spawned; the other runs in a thread of this process (one torch import fewer)."""
    spawn = multiprocessing.get_context("spawn")
    address = free_address()
    results = [spawn.Queue(), queue.Queue()] if silent == 0 else [queue.Queue(), spawn.Queue()]
    signalled = spawn.Process(target=_rank, args=(silent, address, silent, results[silent]))
    signalled.start()
    other = threading.Thread(
        target=_rank, args=(1 - silent, address, silent, results[1 - silent]), daemon=True
    )
    other.start()
    try:
        ready = {rank: pid for _, rank, pid in (box.get(timeout=WAIT_S) for box in results)}
        os.kill(ready[silent], fault)
        phase, rank, message = results[1 - silent].get(timeout=WAIT_S)
    finally:
        signalled.kill()
        signalled.join(timeout=WAIT_S)
        other.join(timeout=WAIT_S)
    assert (phase, rank) == ("failed", 1 - silent), message
    assert message.startswith("the tensor-parallel group failed in an all-reduce: "), message
    if fault == signal.SIGKILL:  # its connection closed at once
        assert "a rank stopped (its connection closed after" in message, message
        assert "did not answer" not in message, message
    else:  # alive but silent: no progress for the timeout
        assert f"a rank did not answer within {TIMEOUT_S:.0f} s (no other rank made progress" in message, (
            message
        )
        assert "stopped" not in message, message
