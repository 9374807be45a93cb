"""The baselines behind the same queue as BlockServe (``dllm worker --policy static|sequential``): static
batches form in arrival order (not by prompt length), each runs until its slowest row is done before the
next is claimed, and every request's tokens are the engine's own for it."""

from __future__ import annotations

import time

import pytest
import redis

from dllm_contracts.queue.messages import EVENT_FIELD, DoneEvent, QueuedRequest, decode_event
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.bench.execute import run_policy
from engine_pod.bench.policies import PolicySpec
from engine_pod.bench.results import PreparedRequest
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from tests.serving_utils import BLOCK, wait_for

PROMPT_LENGTHS = [20, 16, 12, 8, 4]  # later requests are shorter: arrival order is not length order


def _enqueue_all(url: str, service: str) -> tuple[SyncQueue, list[PreparedRequest]]:
    queue = SyncQueue(redis.Redis.from_url(url), QueueOps(service))
    prepared = []
    for index, length in enumerate(PROMPT_LENGTHS):
        request = PreparedRequest(f"r-{index}", [5 + index + t % 7 for t in range(length)], 2 * BLOCK)
        queued = QueuedRequest(
            request.request_id, request.prompt_ids, RequestParams(max_tokens=request.max_tokens), time.time()
        )
        assert queue.run(queue.ops.enqueue(queued, 0))
        prepared.append(request)
        time.sleep(0.005)  # distinct arrival times (Redis's clock, ms)
    return queue, prepared


def _results(queue: SyncQueue, ids: list[str]) -> dict[str, tuple[str, DoneEvent]]:
    """Per request, its done event and the stream id it was written under (when, in ms)."""
    found = {}
    for request_id in ids:
        entries = queue.redis.xrange(queue.ops.keys.events(request_id))
        last = decode_event(entries[-1][1][EVENT_FIELD.encode()]) if entries else None
        if isinstance(last, DoneEvent):
            found[request_id] = (entries[-1][0].decode(), last)
    return found


def _written_at(entry_id: str) -> tuple[int, int]:
    ms, sequence = entry_id.split("-")
    return int(ms), int(sequence)


@pytest.mark.parametrize(("policy", "batch_size"), [("static", 3), ("sequential", 1)])
def test_a_baseline_worker_claims_in_arrival_order_one_batch_at_a_time(
    redis_server, service, make_worker, served_model, policy, batch_size
):
    queue, prepared = _enqueue_all(redis_server.url, service)
    ids = [r.request_id for r in prepared]
    with make_worker(
        redis_server.url, service, worker={"policy": policy, "batch_size": batch_size}
    ) as worker:
        wait_for(lambda: len(_results(queue, ids)) == len(ids), 120, what="every request to finish")
        admitted = [record.admitted for record in worker.engine.records if record.admitted]
    results = _results(queue, ids)
    batches = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
    assert admitted == [len(batch) for batch in batches]  # admissions only when a batch starts
    for earlier, later in zip(batches, batches[1:]):  # a batch ends before the next one's first result
        assert max(_written_at(results[i][0]) for i in earlier) < min(
            _written_at(results[i][0]) for i in later
        )
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK)
    alone = run_policy(
        load_model(str(served_model)),
        decoding,
        PolicySpec(policy, SchedulerConfig(2048), batch_size),
        prepared,
        progress=False,
    )
    assert {i: results[i][1].token_ids for i in ids} == {i: alone.outcomes[i].generated for i in ids}


def _burst(url: str, service: str, ids: list[str]) -> None:
    """The requests enqueued one by one, each publishing its own wakeup as a gateway's enqueues do, in one
    round trip: they arrive microseconds apart however busy this machine is."""
    queue = SyncQueue(redis.Redis.from_url(url), QueueOps(service))
    calls = [
        queue.ops.enqueue(QueuedRequest(i, [7] * 6, RequestParams(max_tokens=BLOCK), time.time()), 0)
        for i in ids
    ]
    queue.run_all(calls)


def _wait_idle(worker) -> None:
    """Until the worker listens for wakeups (it is idle: nothing was enqueued yet)."""
    wait_for(lambda: worker.wakeups.subscribed, 120, what="the worker to listen for wakeups")


def test_an_idle_worker_lets_a_burst_in_before_its_first_cycle(redis_server, service, make_worker):
    """With a batch window the request that wakes the worker does not start a cycle at once: the worker
    waits while more arrive, and the first cycle takes the whole burst. The pause that ends the window is
    a second here (20 ms by default), so that this test's own thread, however slow, is never that pause."""
    ids = [f"b-{i}" for i in range(24)]
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    with make_worker(redis_server.url, service, scheduling={"batch_window_s": 1.0}) as worker:
        worker.wakeups.quiet_s = 1.0
        _wait_idle(worker)
        _burst(redis_server.url, service, ids[:1])
        wait_for(lambda: worker.wakeups.in_batch_window, 120, what="the worker to wait for more of the burst")
        _burst(redis_server.url, service, ids[1:])
        wait_for(lambda: len(_results(queue, ids)) == len(ids), 120, what="the burst to finish")
        assert worker.engine.records[0].admitted == len(ids)


def test_without_a_batch_window_the_first_cycle_starts_with_what_is_there(redis_server, service, make_worker):
    """Without a window the worker starts at the first wakeup: what arrives after its first cycle began
    joins at a later block boundary."""
    ids = [f"b-{i}" for i in range(8)]
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    with make_worker(redis_server.url, service, scheduling={"batch_window_s": 0.0}) as worker:
        _wait_idle(worker)
        _burst(redis_server.url, service, ids[:1])
        wait_for(lambda: len(worker.engine.records) > 0, 120, what="the first cycle")
        _burst(redis_server.url, service, ids[1:])
        wait_for(lambda: len(_results(queue, ids)) == len(ids), 120, what="every request to finish")
        assert worker.engine.records[0].admitted == 1
        assert sum(record.admitted for record in worker.engine.records) == len(ids)


def test_a_static_batch_streams_every_row_block_by_block_after_one_row_finished(
    redis_server, service, make_worker
):
    """A finished row stays in its static batch, computed and never committed, ahead of rows still
    running (arrival order): those rows' blocks are each recorded and streamed once, in order."""
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    budgets = {"short": BLOCK, "long-1": 3 * BLOCK, "long-2": 3 * BLOCK}
    for request_id, max_tokens in budgets.items():
        queued = QueuedRequest(
            request_id, [7] * 6, RequestParams(max_tokens=max_tokens), time.time(), stream=True
        )
        assert queue.run(queue.ops.enqueue(queued, 0))
        time.sleep(0.005)  # arrival order: the short one first
    config = {"policy": "static", "batch_size": 3}
    with make_worker(redis_server.url, service, worker=config, ignore_eos=True) as worker:
        wait_for(lambda: len(_results(queue, list(budgets))) == 3, 60, what="the batch to finish")
        assert [record.admitted for record in worker.engine.records][0] == 3
    for request_id, max_tokens in budgets.items():
        blocks = [e for e in queue.events_of(request_id) if not isinstance(e, DoneEvent)]
        assert [b.index for b in blocks] == list(range(max_tokens // BLOCK)), request_id
        assert (
            sum((b.token_ids for b in blocks), []) == _results(queue, [request_id])[request_id][1].token_ids
        )
