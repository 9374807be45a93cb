"""What the gateway's handlers share, owned by the app's lifespan, and the dependencies that reach it."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Annotated, Protocol

import redis.asyncio as aioredis
from fastapi import Depends, Request

from dllm_contracts.queue.async_client import AsyncQueue
from dllm_contracts.tracing import Tracing
from gateway.api_keys import ApiKeys
from gateway.coalesced_calls import CoalescedCalls
from gateway.delivered import DeliveredEvents
from gateway.errors import ApiError
from gateway.event_reader import EventReader
from gateway.file_store import FileStore
from gateway.key_limits import Caller
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.tokenizer import GatewayTokenizer

SHUTDOWN_MARGIN_S = 3.0  # ends waits this long before the drain timeout (one poll of Redis and a reply)


class BatchHolder(Protocol):
    """What the handlers ask of the batches this process holds (gateway.batch_keeper.BatchKeeper)."""

    gateway: str  # this process's id: the owner written on the batches it holds

    def adopt(self, batch_id: str) -> None: ...

    async def run(self) -> None: ...

    async def release(self) -> None: ...


@dataclass
class GatewayState:
    settings: GatewaySettings
    tokenizer: GatewayTokenizer
    redis: aioredis.Redis
    queue: AsyncQueue
    metrics: GatewayMetrics
    calls: CoalescedCalls  # enqueues and cancellations, sent together when they come together
    events: EventReader  # every waiting request's events, read together
    delivered: DeliveredEvents  # requests whose results were delivered: their events' retention is cut
    api_keys: ApiKeys
    files: FileStore  # the bytes of files and batch outputs (their records are in Redis)
    tracing: Tracing = field(default_factory=Tracing.off)  # request spans (off: no tracer)
    batches: BatchHolder | None = None  # the batches this gateway process holds (set by the lifespan)
    tasks: set[asyncio.Task] = field(default_factory=set)  # background work of this process
    stop_waiting_at: float = math.inf  # monotonic time at which waits end with a 503 (shutting down)

    def shutting_down(self) -> None:
        """Called on SIGTERM (from any thread): waits end with an error early enough to reach clients
        within the drain (every waiter is woken to see its new deadline)."""
        margin = self.settings.drain_timeout_s - SHUTDOWN_MARGIN_S
        self.stop_waiting_at = min(self.stop_waiting_at, time.monotonic() + max(margin, 0.0))
        self.events.wake_all_soon()

    def spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def get_state(request: Request) -> GatewayState:  # async: a sync dependency costs a thread hop
    return request.app.state.gateway


State = Annotated[GatewayState, Depends(get_state)]


async def require_api_key(request: Request, state: State) -> None:
    """Bearer API keys, when the service has any configured (see ``gateway.api_keys``)."""
    check_api_key(state, authorization_of(request.scope["headers"]))


def authorization_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The request's Authorization header ("" when it has none). More than one is a 400: which of them
    holds the key is ambiguous (proxies and servers disagree on the first or the last)."""
    found = [value for name, value in headers if name == b"authorization"]
    if len(found) > 1:
        raise ApiError(
            400,
            f"the request has {len(found)} Authorization headers; send one (Authorization: Bearer <key>)",
            "invalid_request_error",
        )
    return found[0].decode("latin-1") if found else ""


def check_api_key(state: GatewayState, authorization: str) -> Caller:
    """Who the request comes from (anonymous without keys); a 401 for a missing or unknown key.
    ``authorization``: the request's Authorization header ("" when it has none)."""
    if not state.api_keys.required:
        return state.api_keys.anonymous
    scheme, _, token = authorization.partition(" ")
    caller = state.api_keys.caller(token) if scheme.lower() == "bearer" else None
    if caller is None:
        raise ApiError(
            401,
            "missing or invalid API key (send Authorization: Bearer <key>)",
            "invalid_request_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return caller
