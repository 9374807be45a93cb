"""The gateway's one reader of its waiting requests' events.

Each waiting request used to hold a Redis connection of its own in a blocking XREAD: a burst of N
requests opened N connections (each with its set-up round trips) and woke N times. Here one task blocks
in one XREAD over every waiting request's events stream and hands each event to its waiter. A request
that starts waiting while that read is blocked rings this gateway's doorbell (a stream the read also
watches), so the read starts again with it included. Nothing is popped: the reader keeps each waiter's
cursor, and after a Redis fault it reads again from there, with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import deque

from dllm_contracts.queue.async_client import START, AsyncQueue, Event
from dllm_contracts.queue.resilience import REDIS_ERRORS, Backoff

READ_BLOCK_S = 2.0  # longest single blocking read (a waiter's own timeout is its own)
DOORBELL_KEEP_S = 3600  # a doorbell outlives its gateway by this much at most
logger = logging.getLogger(__name__)


class Waiter:
    """One request's events read so far and not yet taken, and where reading goes on from."""

    def __init__(self) -> None:
        self.cursor = START
        self.events: deque[Event] = deque()
        self.woken: asyncio.Future | None = None

    def deliver(self, entries: list[tuple[str, Event]]) -> None:
        for cursor, event in entries:
            self.events.append(event)
            self.cursor = cursor
        if self.woken is not None:
            _settle(self.woken)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class EventReader:
    def __init__(self, queue: AsyncQueue, gateway: str | None = None) -> None:
        self.queue = queue
        self.doorbell = queue.ops.keys.doorbell(gateway or secrets.token_hex(8))
        self._doorbell_cursor = START
        self._waiters: dict[str, Waiter] = {}
        self._someone_waits = asyncio.Event()
        self._reads = 0  # blocking reads started
        self._blocked_in: int | None = None  # the read in progress, by number (None: none)
        self._rung_for = 0  # the read a doorbell was rung for
        self._rings: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop ``run`` reads on

    async def next_event(self, request_id: str, timeout_s: float) -> Event | None:
        """The request's next event, or None if none came within ``timeout_s``. The first call for a
        request starts reading its stream from its beginning; ``leave`` ends that."""
        waiter = self._waiters.get(request_id)
        if waiter is None:
            waiter = self._waiters[request_id] = Waiter()
            self._joined()
        if not waiter.events:  # a future that an event or the timer settles (cheaper than a timeout scope)
            loop = self._loop or asyncio.get_running_loop()
            waiter.woken = woken = loop.create_future()
            timer = loop.call_later(timeout_s, _settle, woken)
            try:
                await woken
            finally:
                timer.cancel()
                waiter.woken = None
        return waiter.events.popleft() if waiter.events else None

    def leave(self, request_id: str) -> None:
        self._waiters.pop(request_id, None)

    def wake_all_soon(self) -> None:
        """Wake every waiter now, from any thread (a signal handler's, a test's): each looks again at
        what it waits for (a shutdown moved its deadline)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for waiter in self._waiters.values():
            if waiter.woken is not None:
                _settle(waiter.woken)

    def waiting(self) -> int:
        """Requests whose streams are read (joined and not left)."""
        return len(self._waiters)

    def _joined(self) -> None:
        self._someone_waits.set()
        if self._blocked_in is not None and self._rung_for != self._blocked_in:
            self._rung_for = self._blocked_in
            task = asyncio.create_task(self._ring())
            self._rings.add(task)
            task.add_done_callback(self._rings.discard)

    async def _ring(self) -> None:
        try:
            await self.queue.ring(self.doorbell, DOORBELL_KEEP_S)
        except REDIS_ERRORS as exc:  # the read is failing too, and will start again by itself
            logger.debug("could not ring the doorbell: %s", exc)

    async def run(self) -> None:
        """Read for every waiter until cancelled."""
        self._loop = asyncio.get_running_loop()
        backoff = Backoff()
        while True:
            if not self._waiters:
                self._someone_waits.clear()
                await self._someone_waits.wait()
                continue
            try:
                found = await self._read_once()
            except REDIS_ERRORS as exc:  # a fault (or, were there one, a refusal): read again, with backoff
                if not backoff.failing:
                    logger.warning("redis unreachable while reading events (%s); retrying", exc)
                await asyncio.sleep(backoff.next_delay())
                continue
            backoff.reset()
            for request_id, entries in found.items():
                waiter = self._waiters.get(request_id)
                if waiter is not None:
                    waiter.deliver(entries)

    async def _read_once(self) -> dict[str, list[tuple[str, Event]]]:
        cursors = {request_id: waiter.cursor for request_id, waiter in self._waiters.items()}
        self._reads += 1
        self._blocked_in = self._reads
        try:
            found, self._doorbell_cursor = await self.queue.read_events(
                cursors, (self.doorbell, self._doorbell_cursor), READ_BLOCK_S
            )
        finally:
            self._blocked_in = None
        return found
