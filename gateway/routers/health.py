"""/healthz (liveness: the process answers), /readyz (readiness: Redis answers too) and /metrics.

Liveness never checks a dependency (DESIGN.md section 8): a Redis outage makes gateways unready,
which takes them out of a Service, not restarted, which would drop every open stream.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from gateway.state import State

router = APIRouter()


@router.get("/healthz", response_class=PlainTextResponse)
async def healthz() -> PlainTextResponse:
    return PlainTextResponse("ok\n")


@router.get("/readyz", response_class=PlainTextResponse)
async def readyz(state: State) -> PlainTextResponse:
    try:
        await state.redis.ping()
    except RedisError as exc:
        return PlainTextResponse(f"redis unreachable: {exc}\n", status_code=503)
    return PlainTextResponse("ok\n")


@router.get("/metrics")
async def metrics(state: State) -> Response:
    try:
        pending, inflight = await state.queue.depth()
        state.metrics.queue_depth.labels("pending").set(pending)
        state.metrics.queue_depth.labels("inflight").set(inflight)
    except RedisError:
        pass
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
