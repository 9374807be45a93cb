"""A key's priority, honoured by the queue: a high-priority tenant's request, enqueued through the
gateway after a normal tenant's, is the one a worker's claim takes first when both wait (the worker's
own claim code and scheduler, one row at a time), though shortest-first would take the other; a normal
one enqueued after a low-priority one is taken first once they wait past the fairness bound."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.messages import QueuedRequest
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.bench.gateway_cost import InstantPeer
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import free_port
from engine_pod.worker.claims import Claims
from tests.serving_utils import BLOCK, WAIT_S, gateway_settings, wait_for

KEYS = "key-high priority=high\nkey-normal\nkey-low priority=low\n"


@pytest.fixture
def gateway(served_model, redis_server, service, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    env = gateway_settings(served_model, redis_server.url, service).to_env()
    env |= {"DLLM_API_KEYS_FILE": str(keys)}
    process = GatewayProcess("127.0.0.1", free_port(), env).start()
    yield process
    process.stop()


def _post(gateway: GatewayProcess, key: str, prompt: str) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{gateway.url}/v1/completions", json=body, headers=headers, timeout=WAIT_S)


def _claim_order(queue: SyncQueue) -> list[int]:
    """In which order a worker admitting one row at a time claims what waits now (the prompt lengths),
    handed back at once."""
    config = SchedulerConfig(token_budget=4096, max_rows=1)
    scheduler = BlockServeScheduler(BLOCK, [0], config)
    taken = []
    Claims(queue, scheduler, config, "w1").take(lambda item, _: taken.append(item), lambda _: None, lambda: 0)
    for item in taken:
        prompt = len(item.request.prompt_ids)
        queue.release("w1", item.request.id, [], prompt)
    return [len(item.request.prompt_ids) for item in taken]


def _pending(queue: SyncQueue) -> int:
    return queue.redis.zcard(queue.ops.keys.pending)


@pytest.mark.parametrize(("first", "then"), [("key-normal", "key-high"), ("key-low", "key-normal")])
def test_the_higher_priority_request_is_claimed_first_though_enqueued_later(
    gateway, redis_server, service, first, then
):
    queue = SyncQueue(sync_client(redis_server.url), QueueOps(service))
    early, late = "a b", "a b c d e f g h i j k l"  # the later one is longer: shortest-first takes the other
    peer = InstantPeer(redis_server.url, BLOCK, service)
    with ThreadPoolExecutor(2) as pool:
        try:
            replies = [pool.submit(_post, gateway, first, early)]
            wait_for(lambda: _pending(queue) == 1, what="the first request queued")
            replies.append(pool.submit(_post, gateway, then, late))
            wait_for(lambda: _pending(queue) == 2, what="both queued")
            lengths = sorted(c.prompt_tokens for c in queue.candidates(10_000, 2).shortest)
            bound = SchedulerConfig(token_budget=4096).max_wait_s  # the fairness bound: both have waited
            wait_for(lambda: queue.candidates(10_000, 2, bound, 2).aged, what="a request past the bound")
            order = _claim_order(queue)
            assert order[0] == lengths[1], order  # the later, longer one: its priority put it first
        finally:
            peer.start()  # answers both, so that their clients end
        try:
            assert all(reply.result(WAIT_S).status_code == 200 for reply in replies)
        finally:
            peer.halt.set()


def test_a_head_start_orders_the_queue_but_the_wait_observed_is_the_real_one(redis_server, service):
    """A high-priority request is dated earlier for the queue's order (it counts as having waited its head
    start), but what the worker observes as its queue wait (the histogram, the trace's queue span) is the
    time it really waited."""
    queue = SyncQueue(sync_client(redis_server.url), QueueOps(service))
    request = QueuedRequest("req-high", [7] * 5, RequestParams(max_tokens=BLOCK), time.time())
    assert queue.run(queue.ops.enqueue_all([request], head_start_ms=60_000))
    (candidate,) = queue.candidates(4096, 4).shortest
    assert candidate.waited_s >= 60  # the queue's order: dated a minute earlier
    assert candidate.queued_s < 30  # what it waited: moments, even on a slow machine
