"""A connection closed under a command in flight is a transient fault, whatever Python error redis-py lets
out of it. A Redis Cluster client that meets a failover closes every node's connections, those other
commands are using included; a command that had checked its connection and not yet written then failed in
redis-py's asyncio connection with ``AttributeError: 'NoneType' object has no attribute 'writelines'``,
which no list of Redis errors names: the gateway answered it with a 500 (1 of 40 requests in the cluster
failover test, under load). Here the same close lands deterministically, on real redis-servers: every
connection our clients open turns it into the ConnectionError it is, and the gateway's enqueue retries it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from types import SimpleNamespace

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from dllm_contracts.queue.async_client import AsyncQueue
from dllm_contracts.queue.connect import async_client, is_cluster_url, node_url, sync_client
from dllm_contracts.queue.keys import ServiceKeys
from dllm_contracts.queue.messages import QueuedRequest
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.resilience import (
    TRANSIENT_ERRORS,
    AsyncConnectionFaults,
    ConnectionFaults,
    connection_fault,
    is_loading,
)
from dllm_contracts.request_params import RequestParams
from gateway.coalesced_calls import CoalescedCalls
from gateway.settings import GatewaySettings
from gateway.submission import enqueue_all

# the window: redis-py has checked its connection and handed the write to asyncio.wait_for, which (up to
# Python 3.11) runs it in a task of its own, started on the loop's next turn
WAIT_FOR_RUNS_A_TASK = sys.version_info < (3, 12)


def test_what_a_connection_raises_is_classified_by_where_it_comes_from():
    """Out of a connection's send or read: a Python error is the connection failing (a ConnectionError, with
    the error as its cause); redis-py's own errors and cancellations stay what they are."""
    for raised in (
        AttributeError("'NoneType' object has no attribute 'writelines'"),
        RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed"),
    ):
        fault = connection_fault(raised)
        assert isinstance(fault, redis.ConnectionError) and isinstance(fault, TRANSIENT_ERRORS)
        assert type(raised).__name__ in str(fault)
    for kept in (
        redis.ResponseError("ERR a script error"),
        redis.ConnectionError("reset"),
        asyncio.CancelledError(),
    ):
        assert connection_fault(kept) is None


def test_a_redis_loading_its_data_is_a_transient_fault():
    loading = redis.BusyLoadingError("Redis is loading the dataset in memory")
    assert isinstance(loading, TRANSIENT_ERRORS) and is_loading(loading)
    assert not is_loading(redis.ConnectionError("Connection refused"))


def _sync_connections(client) -> list:
    if isinstance(client, RedisCluster):
        pools = [node.redis_connection.connection_pool for node in client.get_nodes()]
    else:
        pools = [client.connection_pool]
    taken = [pool.get_connection() for pool in pools]
    for pool, connection in zip(pools, taken):
        pool.release(connection)
    return taken


async def _async_connections(client) -> list:
    if isinstance(client, AsyncRedisCluster):
        nodes = client.get_nodes()
        taken = [node.acquire_connection() for node in nodes]
        for node, connection in zip(nodes, taken):
            node.release(connection)
        return taken
    connection = await client.connection_pool.get_connection()
    await client.connection_pool.release(connection)
    return [connection]


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
async def test_every_client_opens_connections_that_classify_their_failures(single_or_cluster, kind):
    """The worker's (blocking) and the gateway's (asyncio) clients, on one Redis and on a Redis Cluster (whose
    asyncio client takes no connection class: ``connect`` sets it where its nodes read theirs)."""
    url = single_or_cluster.url
    if kind == "blocking":
        client = sync_client(url)
        client.set("k", "v")
        connections, mixin = _sync_connections(client), ConnectionFaults
        client.close()
    else:
        client = async_client(url)
        await client.set("k", "v")
        connections, mixin = await _async_connections(client), AsyncConnectionFaults
        await client.aclose()
    assert connections and all(isinstance(c, mixin) for c in connections), [type(c) for c in connections]


def _sending_on(task: asyncio.Task):
    """The connection ``task`` is sending on, while it waits in the window (None elsewhere)."""
    coroutine, connection = task.get_coro(), None
    while coroutine is not None and getattr(coroutine, "cr_frame", None) is not None:
        name = coroutine.cr_frame.f_code.co_name
        if name == "send_packed_command":
            connection = coroutine.cr_frame.f_locals.get("self")
        elif name == "wait_for" and connection is not None:
            return connection
        coroutine = coroutine.cr_await
    return None


async def _closing_each_send_once(work) -> object:
    """Run ``work`` while closing, once, the connection of the first command it sends, in the window (as a
    cluster client failing over closes the connections other commands use): what ``work`` returns."""
    done = asyncio.ensure_future(work)
    closed = False
    for _ in range(100_000):  # loop turns; the window comes within a few dozen
        await asyncio.sleep(0)
        if done.done() or closed:
            break
        for task in asyncio.all_tasks():
            connection = _sending_on(task)
            if connection is not None:
                await connection.disconnect(nowait=True)
                closed = True
    assert closed, "the command never reached the window"
    return await done


def _gateway_state(client, service: str) -> SimpleNamespace:
    """What the gateway's enqueue reads of its state: settings, the queue and its coalesced calls."""
    queue = AsyncQueue(client, QueueOps(service))
    settings = GatewaySettings(redis_url="redis://unused", service=service, enqueue_timeout_s=30)
    return SimpleNamespace(settings=settings, queue=queue, calls=CoalescedCalls(queue), metrics=None)


def _redis_py_own_client(url: str):
    """A client with redis-py's own connection classes (what ``connect`` made before)."""
    if is_cluster_url(url):
        return AsyncRedisCluster.from_url(node_url(url))
    return aioredis.Redis.from_url(url)


@pytest.mark.skipif(not WAIT_FOR_RUNS_A_TASK, reason="the window is asyncio.wait_for's task (Python <= 3.11)")
async def test_an_enqueue_whose_connection_is_closed_under_it_is_retried_and_accepted(
    single_or_cluster, service
):
    """The gateway's enqueue, its connection closed after redis-py checked it and before it wrote: redis-py's
    own connections let the AttributeError out of the enqueue (the 500); ours make it a ConnectionError,
    retried (by redis-py's cluster client, or the enqueue's own backoff), and the request is accepted."""
    url = single_or_cluster.url
    keys = ServiceKeys(service)
    for client, accepted in ((_redis_py_own_client(url), False), (async_client(url), True)):
        state = _gateway_state(client, service)
        await client.ping()  # the connections are open: the next command goes straight to its send
        request = QueuedRequest(f"r-{accepted}", [1] * 4, RequestParams(max_tokens=32), time.time())
        if accepted:
            await _closing_each_send_once(enqueue_all([request], state))
        else:
            with pytest.raises(AttributeError, match="writelines"):
                await _closing_each_send_once(enqueue_all([request], state))
        assert bool(await client.sismember(keys.live, request.id)) is accepted
        await client.aclose()
