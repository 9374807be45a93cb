"""The gateway's (asyncio) view of the queue."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from dllm_contracts.queue.messages import EVENT_FIELD, BlockEvent, DoneEvent, QueuedRequest, decode_event
from dllm_contracts.queue.ops import QueueOps, ScriptCall, script_sources, text_of

START = "0-0"  # cursor before a stream's first event
Event = BlockEvent | DoneEvent
logger = logging.getLogger(__name__)


class AsyncQueue:
    def __init__(self, client: aioredis.Redis, ops: QueueOps) -> None:
        self.redis = client
        self.ops = ops
        self._scripts = {name: client.register_script(source) for name, source in script_sources().items()}

    async def prepare(self) -> None:
        """Connect before the first request: discover a Redis Cluster's nodes (redis-py's asyncio cluster
        client, initialised lazily by many concurrent first commands, breaks some of their connections)
        and load every script, so the first requests do not each meet NOSCRIPT."""
        await self.redis.initialize()
        await self._load_scripts(set(self._scripts))

    async def _load_scripts(self, names: set[str]) -> None:
        for name in names:
            await self.redis.script_load(self._scripts[name].script)

    async def run(self, call: ScriptCall):
        """One script call (a connection closed under it fails with a ConnectionError: resilience.py)."""
        return await self._scripts[call.script](keys=call.keys, args=call.args)

    async def run_many(self, calls: list[ScriptCall]) -> list:
        """Several calls in one round trip (a pipeline, not a transaction): each one's reply, or the
        error it met. A Redis that lost its scripts (restarted) gets them again and the calls that met
        NOSCRIPT run once more (every queue script can run twice). A fault fails them all (raised).
        redis-py refuses scripts in a Redis Cluster pipeline: there the calls go concurrently."""
        if isinstance(self.redis, RedisCluster):
            return list(await asyncio.gather(*(self.run(call) for call in calls), return_exceptions=True))
        replies = await self._pipelined(calls)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            await self._load_scripts({calls[i].script for i in missing})
            for i, reply in zip(missing, await self._pipelined([calls[i] for i in missing])):
                replies[i] = reply
        return replies

    async def _pipelined(self, calls: list[ScriptCall]) -> list:
        async with self.redis.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.evalsha(self._scripts[call.script].sha, len(call.keys), *call.keys, *call.args)
            return await pipe.execute(raise_on_error=False)

    async def enqueue(self, request: QueuedRequest, max_queued: int = 0) -> bool:
        """False when the queue already holds ``max_queued`` requests (pending + in flight)."""
        return await self.enqueue_all([request], max_queued)

    async def enqueue_all(self, requests: list[QueuedRequest], max_queued: int = 0) -> bool:
        """All of ``requests`` or none: False when the queue cannot take every one of them."""
        return bool(await self.run(self.ops.enqueue_all(requests, max_queued)))

    async def read_events(
        self, cursors: dict[str, str], doorbell: tuple[str, str], timeout_s: float
    ) -> tuple[dict[str, list[tuple[str, Event]]], str]:
        """One blocking read of many requests' events: per request id (read from its cursor) the events
        that came, each with the cursor after it, and the doorbell stream's new cursor (an entry there
        only wakes the read). Every key is in the service's slot, so a Redis Cluster serves the read
        from one node, named here (redis-py would ask a node for an XREAD's keys first)."""
        key_of = {self.ops.keys.events(request_id): request_id for request_id in cursors}
        doorbell_key, doorbell_cursor = doorbell
        keys = [*key_of, doorbell_key]
        args = ["BLOCK", max(1, int(timeout_s * 1000)), "STREAMS", *keys, *cursors.values(), doorbell_cursor]
        options = {}
        if isinstance(self.redis, RedisCluster):
            await self.redis.initialize()  # at once when done (and again after a slot moved)
            options["target_nodes"] = self.redis.get_node_from_key(doorbell_key)
        reply = await self.redis.execute_command("XREAD", *args, **options) or []
        found: dict[str, list[tuple[str, Event]]] = {}
        for stream, entries in _streams(reply):
            key = text_of(stream)
            if key == doorbell_key:
                doorbell_cursor = text_of(entries[-1][0])
                continue
            found[key_of[key]] = [(text_of(i), event) for i, fields in entries if (event := _event(fields))]
        return found, doorbell_cursor

    async def ring(self, doorbell: str, keep_s: int) -> None:
        """Wake a read blocked on ``doorbell`` (one entry kept; the key goes ``keep_s`` after the last ring)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(doorbell, {"r": 1}, maxlen=1, approximate=False)
            pipe.expire(doorbell, keep_s)
            await pipe.execute()

    async def expire_events(self, request_ids: list[str], seconds: int) -> None:
        """Shorten requests' events' retention once their results were delivered (kept a little longer
        than that, not deleted, so that a second result, were there one, could still be seen)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for request_id in request_ids:
                pipe.expire(self.ops.keys.events(request_id), seconds)
            await pipe.execute()

    async def depth(self) -> tuple[int, int]:
        """Pending (both lanes) and in flight."""
        lanes, inflight = await self.lane_depth()
        return sum(lanes.values()), inflight

    async def lane_depth(self) -> tuple[dict[str, int], int]:
        """Pending per lane ("interactive", "batch") and in flight."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in (self.ops.keys.pending, self.ops.keys.batch_pending, self.ops.keys.inflight):
                pipe.zcard(key)
            pending, batch_pending, inflight = await pipe.execute()
        return {"interactive": int(pending), "batch": int(batch_pending)}, int(inflight)


def _streams(reply) -> list:
    """XREAD's reply as (stream, entries) pairs: a list of pairs (RESP2) or a mapping (RESP3)."""
    return list(reply.items()) if isinstance(reply, dict) else list(reply)


def _event(fields: dict) -> Event | None:
    """An entry's event; None (logged) for one this version cannot read, which is then skipped."""
    try:
        return decode_event(fields[EVENT_FIELD.encode()])
    except (KeyError, ValueError, TypeError) as exc:
        logger.error("skipping an unreadable queue event %r: %s", fields, exc)
        return None
