"""The gateway's (asyncio) view of the queue."""

from __future__ import annotations

import redis.asyncio as aioredis

from engine_pod.queue.messages import BlockEvent, DoneEvent, QueuedRequest, decode_event
from engine_pod.queue.ops import QueueOps, ScriptCall, script_sources


class AsyncQueue:
    def __init__(self, client: aioredis.Redis, ops: QueueOps) -> None:
        self.redis = client
        self.ops = ops
        self._scripts = {name: client.register_script(source) for name, source in script_sources().items()}

    async def run(self, call: ScriptCall):
        return await self._scripts[call.script](keys=call.keys, args=call.args)

    async def enqueue(self, request: QueuedRequest, max_queued: int = 0, batch_id: str = "") -> bool:
        """False when the queue already holds ``max_queued`` requests (pending + in flight)."""
        return bool(await self.run(self.ops.enqueue(request, max_queued, batch_id)))

    async def next_event(self, request_id: str, timeout_s: float) -> BlockEvent | DoneEvent | None:
        """The request's next event, or None if none came within ``timeout_s``."""
        item = await self.redis.blpop([self.ops.keys.events(request_id)], timeout=timeout_s)
        return None if item is None else decode_event(item[1])

    async def cancel(self, request_id: str, prompt_tokens: int) -> int:
        """1: cancelled while pending; 2: flagged for its worker; 0: unknown or already done."""
        return int(await self.run(self.ops.cancel(request_id, prompt_tokens)))

    async def depth(self) -> tuple[int, int]:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.ops.keys.pending)
            pipe.zcard(self.ops.keys.inflight)
            pending, inflight = await pipe.execute()
        return int(pending), int(inflight)
