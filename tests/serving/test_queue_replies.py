"""What the queue's replies carry, field by field, against a real redis-server: candidates' sizes and
waits, lease deadlines, each claimed request's own blocks and log probabilities, cancellation results,
batch keys only where a batch is. (test_queue_protocol.py runs the transitions on every backend; these
read the Python side of the protocol, so one backend is enough.) Written from the queue's mutation run
(docs/mutation-testing.md)."""

from __future__ import annotations

import json
import time

import pytest

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.messages import BATCH_META, BlockEvent, DoneEvent, QueuedRequest, decode_event
from dllm_contracts.queue.ops import ANY_WAIT, BlockCommit, CommitReply, QueueOps, now_ms
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from engine_pod.serve.redis_server import RedisServer

LEASE_MS = 60_000


@pytest.fixture
def queue(service):
    server = RedisServer().start()
    yield SyncQueue(sync_client(server.url), QueueOps(service, lease_ms=LEASE_MS))
    server.stop()


def _enqueue(
    queue: SyncQueue, request_id: str, prompt: int, max_tokens: int = 16, logprobs: int | None = None, **extra
) -> None:
    params = RequestParams(max_tokens=max_tokens, logprobs=logprobs)
    request = QueuedRequest(request_id, [1] * prompt, params, time.time(), **extra)
    assert queue.run(queue.ops.enqueue(request)) == 1


def _enqueued_earlier(queue: SyncQueue, request_id: str, seconds: float) -> None:
    """Move a request's enqueueing time ``seconds`` into the past (as if it had waited that long)."""
    keys = queue.ops.keys
    prompt, tokens, enqueued, head_start = queue.redis.hget(keys.sizes, request_id).decode().split()
    earlier = int(enqueued) - int(seconds * 1000)
    queue.redis.hset(keys.sizes, request_id, f"{prompt} {tokens} {earlier} {head_start}")
    queue.redis.zadd(keys.arrivals, {request_id: earlier})


def _batch_keys_in(queue: SyncQueue) -> list[bytes]:
    return [key for key in queue.redis.keys("*") if b":batch" in key]


def test_candidates_carry_each_requests_sizes_and_wait_and_the_aged_oldest_first(queue):
    _enqueue(queue, "r-old", 5, max_tokens=48)
    _enqueue(queue, "r-older", 40, max_tokens=64)
    _enqueue(queue, "r-new", 3, max_tokens=8)
    _enqueued_earlier(queue, "r-old", 10)
    _enqueued_earlier(queue, "r-older", 20)
    read = queue.candidates(max_prefix=30, count=10, max_wait_s=5, aged_count=5)
    assert [(c.id, c.prefix, c.prompt_tokens, c.max_tokens) for c in read.shortest] == [
        ("r-new", 3, 3, 8),
        ("r-old", 5, 5, 48),
    ]
    waits = {c.id: c.waited_s for c in read.shortest}
    assert 0 <= waits["r-new"] < 5 and 10 <= waits["r-old"] < 15  # seconds, by Redis's clock
    assert [(c.id, c.prompt_tokens, c.max_tokens) for c in read.aged] == [
        ("r-older", 40, 64),
        ("r-old", 5, 48),
    ]
    assert 20 <= read.aged[0].waited_s < 25
    assert [c.id for c in queue.candidates(30, 10, max_wait_s=15, aged_count=5).aged] == ["r-older"]
    assert queue.candidates(30, 10, max_wait_s=0, aged_count=5).aged == []  # 0: no bound
    assert queue.candidates(30, 10).aged == []  # by default, none
    oldest = queue.candidates(0, 0, max_wait_s=ANY_WAIT, aged_count=3)  # a baseline's read: arrival order
    assert ([c.id for c in oldest.aged], oldest.shortest) == (["r-older", "r-old", "r-new"], [])
    assert [c.id for c in queue.candidates(0, 0, max_wait_s=ANY_WAIT, aged_count=2).aged] == [
        "r-older",
        "r-old",
    ]


def test_a_request_enqueued_without_sizes_is_read_by_its_prefix_alone(queue):
    """A request queued by a gateway older than the sizes hash: its prefix is all a worker knows."""
    _enqueue(queue, "r-1", 7)
    queue.redis.hdel(queue.ops.keys.sizes, "r-1")
    (candidate,) = queue.candidates(100, 1).shortest
    assert (candidate.prompt_tokens, candidate.max_tokens, candidate.waited_s) == (7, 1, 0)


def test_a_claimed_lease_runs_its_length_and_a_renewal_extends_it(queue):
    _enqueue(queue, "r-1", 4)
    before = now_ms()
    queue.claim("w1", 100, 1)
    deadline = queue.redis.zscore(queue.ops.keys.inflight, "r-1")
    assert before + LEASE_MS <= deadline <= now_ms() + LEASE_MS
    assert queue.reap() == 0  # nothing expired: nothing returned
    queue.redis.zadd(queue.ops.keys.inflight, {"r-1": before})  # as if the lease had run out
    assert queue.renew("w1", ["r-1"]) == set()  # still ours: renewed
    assert queue.redis.zscore(queue.ops.keys.inflight, "r-1") >= before + LEASE_MS


def test_each_claimed_request_comes_back_with_its_own_blocks_and_log_probabilities(queue):
    for request_id in ("r-1", "r-2"):
        _enqueue(queue, request_id, 4, logprobs=0)
    queue.claim("w1", 100, 2)
    entries = {"r-1": [[-0.5, []], [-0.25, [[9, -1.5]]]], "r-2": [[-2.0, []], [-3.0, []]]}
    tokens = {"r-1": [7, 8], "r-2": [5, 6]}
    blocks = [BlockCommit(i, None, tokens[i], 6, 0, entries[i]) for i in ("r-1", "r-2")]
    assert queue.commit("w1", blocks, []).lost == set()
    assert queue.events_of("r-1") == []  # not streaming: the block is recorded, not published
    for request_id in ("r-1", "r-2"):
        assert queue.release("w1", request_id, tokens[request_id], 6)
    claimed = {c.request.id: c for c in queue.claim("w2", 100, 2)}
    assert {i: (c.generated, c.logprobs) for i, c in claimed.items()} == {
        i: (tokens[i], entries[i]) for i in ("r-1", "r-2")
    }


def test_a_streamed_block_is_published_as_it_was_committed(queue):
    _enqueue(queue, "r-1", 4)
    queue.claim("w1", 100, 1)
    assert queue.progress("w1", "r-1", BlockEvent(0, [7, 8]), [7, 8], 6)
    assert queue.events_of("r-1") == [BlockEvent(0, [7, 8])]


def test_cancelling_a_queued_request_answers_it_with_an_empty_cancelled_result(queue):
    _enqueue(queue, "r-1", 3)
    assert queue.run(queue.ops.cancel("r-1", 3)) == 1
    (done,) = queue.events_of("r-1")
    assert done == DoneEvent([], "cancelled", 3, 0)
    assert _batch_keys_in(queue) == []  # no batch: no batch keys written


def test_cancelling_a_batch_member_records_its_result_in_the_batch(queue):
    _enqueue(queue, "r-1", 3, meta={BATCH_META: "batch-1"})
    assert queue.run(queue.ops.cancel("r-1", 3, "batch-1")) == 1
    assert queue.redis.hget(queue.ops.keys.batch("batch-1"), "failed") == b"1"  # cancelled: not completed
    (line,) = queue.redis.hvals(queue.ops.keys.batch_results("batch-1"))
    assert decode_event(json.loads(line)["done"]).finish_reason == "cancelled"


def test_requests_of_no_batch_write_no_batch_keys(queue):
    queue.run(
        queue.ops.enqueue_all(
            [QueuedRequest(f"r-{i}", [1] * 3, RequestParams(max_tokens=16), time.time()) for i in range(2)]
        )
    )
    queue.claim("w1", 100, 2)
    assert queue.complete("w1", "r-0", DoneEvent([7], "stop", 3, 1))
    assert _batch_keys_in(queue) == []


def test_enqueueing_is_unbounded_by_default_and_takes_one_batch_at_a_time(queue):
    for i in range(3):
        _enqueue(queue, f"r-{i}", 2)  # QueueOps.enqueue's default max_queued: no limit
    mixed = [
        QueuedRequest(f"m-{b}", [1], RequestParams(max_tokens=4), time.time(), meta={BATCH_META: b})
        for b in ("b-1", "b-2")
    ]
    with pytest.raises(ValueError, match=r"one batch, got \['b-1', 'b-2'\]"):
        queue.ops.enqueue_all(mixed)
    assert queue.depth() == (3, 0)


def test_a_commit_with_nothing_to_say_makes_no_call_and_an_empty_reply(queue):
    assert queue.commit("w1", [], []) == CommitReply(set(), {}, set())


def test_an_event_of_no_known_type_is_refused_by_name():
    with pytest.raises(ValueError, match="'bogus'"):
        decode_event('{"type": "bogus"}')
    with pytest.raises(ValueError, match="None"):
        decode_event('{"token_ids": []}')


class _RacedQueue(SyncQueue):
    """A queue whose first read of candidates is stale: another worker claims one of them between the
    read and our claim (as on a shared queue)."""

    rival_took: str | None = None

    def candidates(self, *args, **kwargs):
        read = super().candidates(*args, **kwargs)
        if self.rival_took is None and read.shortest:
            self.rival_took = read.shortest[0].id
            self.claim_chosen("rival", [(read.shortest[0].id, read.shortest[0].prefix)])
        return read


def test_a_claim_that_lost_candidates_to_a_race_reads_again_up_to_its_count(queue):
    for i in range(5):
        _enqueue(queue, f"r-{i}", 2 + i)
    raced = _RacedQueue(queue.redis, queue.ops)
    claimed = [c.request.id for c in raced.claim("w1", 100, 3)]
    assert raced.rival_took == "r-0"
    assert claimed == ["r-1", "r-2", "r-3"]  # the two left from the first read, then one more
    assert queue.depth() == (1, 4)
