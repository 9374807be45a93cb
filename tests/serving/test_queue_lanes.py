"""The batch lane, a batch's durable ingestion and its lease, against a real redis-server: interactive
requests are offered before batch lines, batch lines fill the rest and are offered among the aged past
their bound; INGEST queues a chunk and moves the cursor once, only for the lease's holder; a lease is one
gateway's until it expires; the queue depth (what autoscaling reads) counts the batch backlog, the
interactive depth limit does not."""

from __future__ import annotations

import json
import time

import pytest
from dllm_operator.autoscale import queue_depth

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.messages import BATCH_META, DoneEvent, QueuedRequest
from dllm_contracts.queue.ops import IngestChunk, QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from engine_pod.serve.redis_server import RedisServer


@pytest.fixture
def queue(service):
    server = RedisServer().start()
    yield SyncQueue(sync_client(server.url), QueueOps(service))
    server.stop()


def _request(request_id: str, prompt: int = 4, batch: str = "") -> QueuedRequest:
    return QueuedRequest(
        request_id,
        [1] * prompt,
        RequestParams(max_tokens=8),
        time.time(),
        meta={BATCH_META: batch} if batch else {},
    )


def _batch(queue: SyncQueue, batch_id: str, owner: str = "g1", total: int = 4) -> None:
    fields = {
        "status": "validating",
        "owner": owner,
        "cursor": 0,
        "total": total,
        "completed": 0,
        "failed": 0,
    }
    queue.redis.hset(queue.ops.keys.batch(batch_id), mapping=fields)


def _ingest(queue: SyncQueue, batch_id: str, start: int, ids: list[str], owner: str = "g1", errors=()):
    requests = [_request(i, batch=batch_id) for i in ids]
    chunk = IngestChunk(owner, start, start + len(ids) + len(errors), requests, list(errors))
    return queue.run(queue.ops.ingest(batch_id, chunk, 3600))


def test_interactive_requests_are_offered_first_and_batch_lines_fill_the_rest(queue):
    _batch(queue, "b1")
    assert _ingest(queue, "b1", 0, ["b-1", "b-2", "b-3"]) == 1
    queue.run(queue.ops.enqueue(_request("i-1", prompt=9)))
    read = queue.candidates(max_prefix=100, count=2)
    assert [(c.id, c.batch) for c in read.shortest] == [("i-1", False), ("b-1", True)]  # shorter, yet after
    assert [c.id for c in queue.candidates(max_prefix=100, count=1).shortest] == ["i-1"]
    assert [c.id for c in queue.candidates(max_prefix=100, count=3, batch_room=1).shortest] == ["i-1", "b-1"]
    assert all(c.waited_s == 0 for c in read.shortest if c.batch)  # never takes an interactive turn


def test_batch_lines_past_their_bound_are_offered_among_the_aged_however_busy_the_interactive_lane(queue):
    _batch(queue, "b1")
    assert _ingest(queue, "b1", 0, ["b-1"]) == 1
    for i in range(3):
        queue.run(queue.ops.enqueue(_request(f"i-{i}")))
    time.sleep(0.05)
    read = queue.candidates(max_prefix=100, count=3, max_wait_s=60, aged_count=2, batch_wait_s=0.01)
    assert [c.id for c in read.shortest] == ["i-0", "i-1", "i-2"]
    assert [c.id for c in read.aged] == ["b-1"]  # aging: the batch progresses
    assert not queue.candidates(100, 3, 60, 2, batch_wait_s=600).aged
    claimed = queue.claim_chosen("w1", [("b-1", 4)])
    assert [c.request.id for c in claimed] == ["b-1"]  # claimed from its lane


def test_a_reaped_or_released_batch_line_goes_back_to_the_batch_lane(queue):
    _batch(queue, "b1")
    _ingest(queue, "b1", 0, ["b-1"])
    queue.claim_chosen("w1", [("b-1", 4)])
    assert queue.release("w1", "b-1", [], 4)
    keys = queue.ops.keys
    assert (
        queue.redis.zscore(keys.batch_pending, "b-1") == 4 and queue.redis.zscore(keys.pending, "b-1") is None
    )
    assert queue.redis.zscore(keys.batch_arrivals, "b-1") is not None


def test_a_chunk_is_queued_and_the_cursor_moved_once_only_by_the_lease_holder(queue):
    _batch(queue, "b1")
    error_line = ("line:2", json.dumps({"index": 2, "line": {"custom_id": "x"}}))
    assert _ingest(queue, "b1", 0, ["b-1", "b-2"], errors=[error_line]) == 1
    record = queue.redis.hgetall(queue.ops.keys.batch("b1"))
    assert (record[b"cursor"], record[b"failed"]) == (b"3", b"1")
    assert _ingest(queue, "b1", 0, ["b-9", "b-10"], errors=[error_line]) == 0  # a repeat: refused
    assert _ingest(queue, "b1", 3, ["b-4"], owner="g2") == 0  # not the holder: refused
    keys = queue.ops.keys
    assert queue.redis.lrange(keys.batch_members("b1"), 0, -1) == [b"b-1", b"b-2"]
    assert queue.redis.zcard(keys.batch_pending) == 2 and queue.redis.hget(keys.batch("b1"), "failed") == b"1"
    queue.redis.hset(keys.batch("b1"), "status", "cancelling")
    assert _ingest(queue, "b1", 3, ["b-4"]) == 2  # a cancel came first: nothing queued
    assert queue.redis.zcard(keys.batch_pending) == 2
    assert _ingest(queue, "gone", 0, ["b-5"]) == -1


def test_a_batch_lease_is_one_gateways_until_it_expires(queue):
    _batch(queue, "b1")
    lease = queue.ops.batch_lease
    assert queue.run(lease("b1", "g1", 60_000, False)) == 1
    assert queue.run(lease("b1", "g2", 60_000, False)) == 0  # held and live
    assert queue.run(lease("b1", "g2", 60_000, True)) == 0  # only the holder renews
    assert queue.run(lease("b1", "g1", 0, True)) == 1  # given up (a gateway stopping)
    assert queue.run(lease("b1", "g2", 60_000, False)) == 1  # taken over
    assert queue.redis.hget(queue.ops.keys.batch("b1"), "owner") == b"g2"
    queue.redis.hset(queue.ops.keys.batch("b1"), "status", "completed")
    assert queue.run(lease("b1", "g2", 60_000, True)) == -1
    assert queue.redis.zcard(queue.ops.keys.batch_leases) == 0  # an ended batch leaves the leases


def test_a_line_ended_twice_is_recorded_and_counted_once(queue):
    _batch(queue, "b1", total=1)
    _ingest(queue, "b1", 0, ["b-1"])
    queue.claim_chosen("w1", [("b-1", 4)])
    done = DoneEvent([7], "stop", 4, 1, meta={BATCH_META: "b1"})
    assert queue.complete("w1", "b-1", done)
    keys = queue.ops.keys
    queue.redis.hset(keys.request("b-1"), mapping={"state": "running", "worker": "w1"})  # as if replayed
    queue.redis.zadd(keys.inflight, {"b-1": 1})
    queue.complete("w1", "b-1", done)
    assert queue.redis.hlen(keys.batch_results("b1")) == 1
    assert queue.redis.hget(keys.batch("b1"), "completed") == b"1"


def test_autoscaling_counts_the_batch_backlog_and_the_depth_limit_does_not(queue, service):
    _batch(queue, "b1")
    _ingest(queue, "b1", 0, [f"b-{i}" for i in range(5)])
    url = f"redis://127.0.0.1:{queue.redis.connection_pool.connection_kwargs['port']}"
    assert queue_depth(url, service) == 5  # what the operator's autoscaler (and KEDA: the same set) reads
    assert queue.run(queue.ops.enqueue(_request("i-1"), max_queued=1)) == 1  # the backlog is not counted
    assert queue.run(queue.ops.enqueue(_request("i-2"), max_queued=1)) == 0
    assert queue.depth() == (6, 0)
