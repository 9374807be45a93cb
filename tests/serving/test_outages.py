"""Faults under load, on the product's processes: ``python -m gateway``, two ``dllm worker`` and a
redis-server with its append-only file, a few hundred requests (every fourth one streamed).

Each case counts sent, completed, lost, duplicated and 5xx (README "Faults" shows the table), and
checks every completed text against the request's greedy output generated alone.

CI runs the Redis Cluster case and the stream drain here; the single-Redis cases (a worker killed, Redis
killed, Redis frozen) run in CI through ``dllm serve`` (``tests/serving/test_serve.py``) and here under
the slow marker (``scripts/fault-table.sh`` runs them all).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import redis

from dllm_contracts.queue.connect import REDIS_PASSWORD_ENV, sync_client
from dllm_contracts.queue.keys import ServiceKeys
from tests.redis_cluster import LocalRedisCluster
from tests.serving.outage_harness import Stack, Tally, reference_texts, start_load, wait_under_way
from tests.serving_utils import BLOCK, WAIT_S, wait_for

MAX_TOKENS = 2 * BLOCK
WORDS = ["cat", "dog", "fox", "owl", "red", "sun", "sky", "sea"]
PROMPTS = [f"copy : {' '.join(WORDS[i % 8 : i % 8 + 1 + i % 3])} ." for i in range(200)]


def _done_count(stack: Stack) -> int:
    client = sync_client(stack.redis.url, socket_timeout=2)
    try:
        return sum(
            (client.hget(k, "state") or b"") == b"done"
            for k in client.scan_iter(ServiceKeys(stack.service).request("*"))
        )
    except redis.RedisError:
        return 0


REPORT_ENV = (
    "DLLM_FAULT_REPORT"  # a JSON-lines file that collects each case's counts (scripts/fault-table.sh)
)


def _report(case: str, row: dict) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"case": case} | row) + "\n")


def _run_case(served_model, service, tmp_path, fault, prompts=PROMPTS, **stack_options) -> Tally:
    with Stack(served_model, service, tmp_path, **stack_options) as stack:
        load = start_load(stack.gateway.url, prompts, MAX_TOKENS)
        wait_for(lambda: _done_count(stack) >= 20 or load.done(), 120, what="the load to get going")
        assert _done_count(stack) < len(prompts) - 20, "the fault must land while the load runs"
        fault(stack)
        outcomes = load.result(timeout=300)
        tally = Tally(outcomes, stack.duplicate_results())
    _report(fault.__doc__ or fault.__name__, tally.row())
    return tally


def _assert_nothing_lost(tally: Tally, served_model) -> None:
    failed = [(o.prompt, o.stream, o.status, o.error) for o in tally.outcomes if not o.completed][:5]
    assert tally.row()["completed"] == tally.row()["sent"], (tally.row(), failed)
    assert tally.row()["5xx"] == 0 and tally.row()["duplicated"] == 0, tally.row()
    assert all(o.done_marker for o in tally.outcomes if o.stream)
    expected = reference_texts(served_model, [o.prompt for o in tally.outcomes], MAX_TOKENS)
    wrong = [(o.prompt, o.text, e) for o, e in zip(tally.outcomes, expected) if o.text != e][:3]
    assert not wrong, wrong


@pytest.mark.slow  # through `dllm serve` in CI: tests/serving/test_serve.py
def test_no_fault(served_model, service, tmp_path):
    def no_fault(stack: Stack) -> None:
        """(e) no fault"""

    tally = _run_case(served_model, service, tmp_path, no_fault)
    _assert_nothing_lost(tally, served_model)


@pytest.mark.slow  # through `dllm serve` in CI: tests/serving/test_serve.py
def test_redis_frozen_for_five_seconds(served_model, service, tmp_path):
    def freeze(stack: Stack) -> None:
        """(c) Redis frozen 5 s (SIGSTOP, SIGCONT)"""
        stack.freeze_redis(5.0)

    tally = _run_case(served_model, service, tmp_path, freeze)
    _assert_nothing_lost(tally, served_model)


@pytest.mark.slow  # through `dllm serve` in CI: tests/serving/test_serve.py
def test_redis_killed_and_restarted_from_its_append_only_file(served_model, service, tmp_path):
    def crash(stack: Stack) -> None:
        """(b) Redis killed (SIGKILL) and restarted on its append-only file"""
        stack.restart_redis()

    tally = _run_case(served_model, service, tmp_path, crash)
    _assert_nothing_lost(tally, served_model)


def _kill_twice(stack: Stack) -> None:
    """(a) a worker killed (SIGKILL) twice and restarted"""
    for _ in range(2):
        victim = stack.workers[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        time.sleep(1.0)
        stack.workers[0] = stack.start_worker(0)
        time.sleep(2.0)


@pytest.mark.slow  # through `dllm serve` in CI: tests/serving/test_serve.py
def test_a_worker_killed_repeatedly(served_model, service, tmp_path):
    tally = _run_case(served_model, service, tmp_path, _kill_twice)
    _assert_nothing_lost(tally, served_model)


def test_on_a_redis_cluster_a_worker_killed_repeatedly(served_model, service, tmp_path):
    """The gateway and both workers on a three-master Redis Cluster (redis+cluster:// URL); the killed
    worker's leases expire and are reaped, claimed and completed on the cluster."""

    def kill_twice_on_a_cluster(stack: Stack) -> None:
        """(a) on a Redis Cluster: a worker killed (SIGKILL) twice and restarted"""
        _kill_twice(stack)

    cluster = LocalRedisCluster()
    tally = _run_case(served_model, service, tmp_path, kill_twice_on_a_cluster, redis_backend=cluster)
    _assert_nothing_lost(tally, served_model)


def _taken_over(cluster: LocalRedisCluster, key: str, dead) -> bool:
    try:
        return cluster.master_of(key) is not dead
    except RuntimeError:  # no node serves the slot yet
        return False


def test_on_a_redis_cluster_with_replicas_a_killed_master_fails_over(
    served_model, service, tmp_path, monkeypatch
):
    """The supported HA Redis: a password-protected three-master Redis Cluster, each master with a replica.
    The master holding the service's queue is killed (SIGKILL) under load; its replica takes over its slots,
    and the same gateway and worker, never restarted, answer every request: those in flight at the kill
    and those sent after the takeover."""
    monkeypatch.setenv(REDIS_PASSWORD_ENV, "cluster-secret")  # the gateway's, the worker's and ours
    cluster = LocalRedisCluster(replicas=1, password="cluster-secret", node_timeout_ms=1000)
    with Stack(served_model, service, tmp_path, workers=1, redis_backend=cluster) as stack:
        during = start_load(stack.gateway.url, PROMPTS[:24], MAX_TOKENS)
        wait_under_way(during)
        key = ServiceKeys(service).live  # every key of a service shares its hash tag: one slot
        master = cluster.master_of(key)
        assert not during.done(), "the kill must land while the load runs"
        master.kill()
        wait_for(lambda: _taken_over(cluster, key, master), 60, what="a replica taking over the slot")
        after = start_load(stack.gateway.url, PROMPTS[24:40], MAX_TOKENS).result(timeout=300)
        during = during.result(timeout=300)
        duplicated = stack.duplicate_results()
    tally = Tally(during + after, duplicated)
    _report(
        "(f) on a Redis Cluster with replicas: the queue's master killed, its replica takes over", tally.row()
    )
    _assert_nothing_lost(tally, served_model)


def test_sigterm_to_the_gateway_ends_every_open_stream_with_done(served_model, service, tmp_path):
    """Slow workers leave streams waiting; after SIGTERM each one completes or gets an error event and
    [DONE] before the gateway exits (within its drain timeout)."""

    def terminate(stack: Stack) -> None:
        began = time.monotonic()
        stack.gateway.process.send_signal(signal.SIGTERM)
        stack.gateway.process.wait(timeout=WAIT_S)
        # within its drain timeout (6 s), with room for a process starved of CPU to exit: not the 600 s
        # a request may wait
        assert time.monotonic() - began < 6 + 15, "the gateway must stop within its drain timeout"

    with Stack(served_model, service, tmp_path, workers=1) as stack:
        stack.workers[0].send_signal(signal.SIGSTOP)  # work piles up: streams are open at SIGTERM
        load = start_load(stack.gateway.url, PROMPTS[:40], 8 * BLOCK, concurrency=40, stream_every=1)
        wait_for(lambda: _pending(stack) >= 30, what="streams waiting in the queue")
        try:  # the worker stays stopped through the drain: however fast the host, streams are still open
            terminate(stack)
        finally:
            stack.workers[0].send_signal(signal.SIGCONT)
        outcomes = load.result(timeout=60)
    opened = [o for o in outcomes if o.status == 200]
    ended_with_error = sum(o.error is not None for o in opened)
    _report(
        "(d) SIGTERM to the gateway with streams open",
        {
            "sent": len(outcomes),
            "completed": sum(o.completed for o in outcomes),
            "streams_opened": len(opened),
            "ended_with_error_and_done": ended_with_error,
            "5xx": sum((o.status or 0) >= 500 for o in outcomes),
        },
    )
    assert opened, "streams should have been open when the gateway was told to stop"
    for o in opened:
        assert o.done_marker, (o.prompt, o.text, o.error)
        assert o.finish_reason is not None or o.error, "a stream must complete or say why it did not"
    assert any(o.error and "shutting down" in o.error for o in opened)


def _pending(stack: Stack) -> int:
    try:
        return redis.Redis.from_url(stack.redis.url).zcard(ServiceKeys(stack.service).pending)
    except redis.RedisError:
        return 0
