"""Shortening the retention of delivered requests' events, a batch at a time.

A request's events stream is kept as long as its result (an hour by default) so that a gateway can still
read it after a fault; once its result reached the client, a minute is enough. Expiring each stream as
its result is delivered cost a Redis round trip per request; here delivered ids are collected and
expired together, one pipeline every ``FLUSH_S``. Losing a batch to a Redis fault loses nothing: those
streams expire with their results.
"""

from __future__ import annotations

import asyncio
import logging

from dllm_contracts.queue.async_client import AsyncQueue
from dllm_contracts.queue.resilience import REDIS_ERRORS

DELIVERED_EVENTS_TTL_S = 60  # a delivered request's events stay this long (else: the result retention)
FLUSH_S = 0.05  # how often collected ids are expired
MAX_COLLECTED = 100_000  # ids kept while Redis is away (beyond: left to expire with their results)
logger = logging.getLogger(__name__)


class DeliveredEvents:
    def __init__(self, queue: AsyncQueue) -> None:
        self.queue = queue
        self._collected: list[str] = []

    def add(self, request_id: str) -> None:
        if len(self._collected) < MAX_COLLECTED:
            self._collected.append(request_id)

    async def run(self) -> None:
        """Expire what was collected, every ``FLUSH_S``, until cancelled (then once more)."""
        try:
            while True:
                await asyncio.sleep(FLUSH_S)
                await self.flush()
        finally:
            await asyncio.shield(self.flush())

    async def flush(self) -> None:
        ids, self._collected = self._collected, []
        if not ids:
            return
        try:
            await self.queue.expire_events(ids, DELIVERED_EVENTS_TTL_S)
        except REDIS_ERRORS as exc:
            logger.debug("could not shorten the events' retention of %d requests: %s", len(ids), exc)
