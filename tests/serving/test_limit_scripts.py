"""The limit scripts against a real redis-server and a real Redis Cluster (every key a script names is
in the service's slot): a window's counts, the tickets of requests in flight and their expiry, tokens
given back, a tenant's batch lines."""

from __future__ import annotations

import time

import pytest

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.limit_ops import Admission, LimitOps
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from tests.serving_utils import wait_for

TENANT = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def limits(single_or_cluster, service):
    queue = SyncQueue(sync_client(single_or_cluster.url), QueueOps(service))
    return queue, LimitOps(queue.ops.keys)


def _admit(queue, ops, rpm=0, tpm=0, concurrency=0, tokens=1, ticket="t", ticket_ms=60_000) -> Admission:
    return Admission.parse(queue.run(ops.admit(TENANT, rpm, tpm, concurrency, tokens, ticket, ticket_ms)))


def test_requests_and_tokens_are_counted_in_one_window_and_unused_tokens_given_back(limits):
    queue, ops = limits
    wait_for(lambda: time.time() % 60 < 50, 15, 0.2, what="a window with time left")
    first = _admit(queue, ops, rpm=2, tpm=100, tokens=60)
    assert (first.refused, first.requests, first.tokens) == ("", 1, 60)
    assert 0 < first.reset_ms <= 60_000
    assert _admit(queue, ops, rpm=2, tpm=100, tokens=50).refused == "tokens"  # nothing counted
    queue.run(ops.release(TENANT, "t", first.window, 20))  # 20 of its tokens unused
    second = _admit(queue, ops, rpm=2, tpm=100, tokens=50)
    assert (second.refused, second.requests, second.tokens) == ("", 2, 90)
    assert _admit(queue, ops, rpm=2, tpm=100, tokens=1).refused == "requests"
    assert _admit(queue, ops, tpm=100, tokens=101).refused == "too_large"


def test_a_ticket_holds_a_place_in_flight_until_released_or_expired(limits):
    queue, ops = limits
    held = _admit(queue, ops, concurrency=1, ticket="a")
    assert held.running == 1
    assert _admit(queue, ops, concurrency=1, ticket="b").refused == "concurrency"
    queue.run(ops.release(TENANT, "a", held.window, 0))
    assert _admit(queue, ops, concurrency=1, ticket="c", ticket_ms=200).running == 1
    # "c" is never released (its gateway died): its place comes back when it expires
    wait_for(lambda: _admit(queue, ops, concurrency=1, ticket="d").refused == "", 10, 0.1, what="expiry")


def test_batch_lines_are_reserved_per_batch_and_given_back(limits):
    queue, ops = limits
    assert queue.run(ops.reserve_batch_lines(TENANT, 10, "batch_1", 6, 60_000)) == [1, 6]
    assert queue.run(ops.reserve_batch_lines(TENANT, 10, "batch_2", 6, 60_000)) == [0, 6]
    queue.redis.hdel(queue.ops.keys.batch_lines_of(TENANT), "batch_1")
    assert queue.run(ops.reserve_batch_lines(TENANT, 10, "batch_2", 6, 60_000)) == [1, 6]
