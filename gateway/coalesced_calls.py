"""Queue calls that handlers make at the same time, sent to Redis together.

Under a burst every handler enqueues at once; each ENQUEUE on its own took a pooled connection (a fresh
gateway opened one per request, each with its set-up round trips) and a round trip. Here one sender
takes every call waiting, runs them in one pipeline, and answers each caller with its own reply; calls
that arrive meanwhile go in the next pipeline. A lone call goes at once, as before.
"""

from __future__ import annotations

import asyncio

from dllm_contracts.queue.async_client import AsyncQueue
from dllm_contracts.queue.ops import ScriptCall


class CoalescedCalls:
    def __init__(self, queue: AsyncQueue) -> None:
        self.queue = queue
        self._waiting: list[tuple[ScriptCall, asyncio.Future]] = []
        self._sender: asyncio.Task | None = None

    async def run(self, call: ScriptCall):
        """``call``'s reply; its error (a script's refusal, a Redis fault) is raised here."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((call, future))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send())
        return await future

    async def _send(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                await self._send_batch(batch)
        finally:
            self._sender = None

    async def _send_batch(self, batch: list[tuple[ScriptCall, asyncio.Future]]) -> None:
        try:
            if len(batch) == 1:
                replies = [await self.queue.run(batch[0][0])]
            else:
                replies = await self.queue.run_many([call for call, _ in batch])
        except Exception as exc:  # a fault: every caller meets it (and retries as it would alone)
            replies = [exc] * len(batch)
        for (_, future), reply in zip(batch, replies):
            if future.done():  # its caller went away
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)
