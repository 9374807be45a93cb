"""The gateway's (asyncio) view of the queue."""

from __future__ import annotations

import redis.asyncio as aioredis

from engine_pod.queue.messages import EVENT_FIELD, BlockEvent, DoneEvent, QueuedRequest, decode_event
from engine_pod.queue.ops import QueueOps, ScriptCall, script_sources

START = "0-0"  # cursor before a stream's first event


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
        for script in self._scripts.values():
            await self.redis.script_load(script.script)

    async def run(self, call: ScriptCall):
        return await self._scripts[call.script](keys=call.keys, args=call.args)

    async def enqueue(self, request: QueuedRequest, max_queued: int = 0) -> bool:
        """False when the queue already holds ``max_queued`` requests (pending + in flight)."""
        return await self.enqueue_all([request], max_queued)

    async def enqueue_all(self, requests: list[QueuedRequest], max_queued: int = 0) -> bool:
        """All of ``requests`` or none: False when the queue cannot take every one of them."""
        return bool(await self.run(self.ops.enqueue_all(requests, max_queued)))

    async def next_event(
        self, request_id: str, cursor: str, timeout_s: float
    ) -> tuple[BlockEvent | DoneEvent | None, str]:
        """The request's first event after ``cursor`` (None if none came within ``timeout_s``) and the
        cursor to read on from. Nothing is removed: after a lost reply, read again from the same cursor."""
        key = self.ops.keys.events(request_id)
        reply = await self.redis.xread({key: cursor}, count=1, block=max(1, int(timeout_s * 1000)))
        if not reply:
            return None, cursor
        entry_id, fields = reply[0][1][0]
        entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return decode_event(fields[EVENT_FIELD.encode()]), entry

    async def expire_events(self, request_id: str, seconds: int) -> None:
        """Shorten a request's events' retention once its result was delivered (kept a little longer
        than that, not deleted, so that a second result, were there one, could still be seen)."""
        await self.redis.expire(self.ops.keys.events(request_id), seconds)

    async def cancel(self, request: QueuedRequest) -> int:
        """1: cancelled while pending; 2: flagged for its worker; 0: unknown or already done."""
        return int(await self.run(self.ops.cancel(request.id, len(request.prompt_ids), request.batch_id)))

    async def depth(self) -> tuple[int, int]:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.ops.keys.pending)
            pipe.zcard(self.ops.keys.inflight)
            pending, inflight = await pipe.execute()
        return int(pending), int(inflight)
