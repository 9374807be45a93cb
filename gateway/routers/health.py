"""/healthz (liveness: the process answers), /readyz (readiness: Redis answers, and the keys file, if any,
is watched) and /metrics.

Liveness never checks a dependency (DESIGN.md section 8): a Redis outage makes gateways unready,
which takes them out of a Service, not restarted, which would drop every open stream. /metrics needs the
API key when the service has keys, unless ``metrics_port`` serves it on a port of its own.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from gateway.errors import ApiError
from gateway.state import State, require_api_key

router = APIRouter()


@router.get("/healthz", response_class=PlainTextResponse)
async def healthz() -> PlainTextResponse:
    return PlainTextResponse("ok\n")


@router.get("/readyz", response_class=PlainTextResponse)
async def readyz(state: State) -> PlainTextResponse:
    unwatched = state.api_keys.watch_failure()
    if unwatched is not None:  # revoked keys would go on working: out of the Service until restarted
        return PlainTextResponse(f"{unwatched}\n", status_code=503)
    try:
        await state.redis.ping()
    except RedisError as exc:
        return PlainTextResponse(f"redis unreachable: {exc}\n", status_code=503)
    return PlainTextResponse("ok\n")


async def refresh_queue_depth(state) -> None:
    try:
        lanes, inflight = await state.queue.lane_depth()
        state.metrics.queue_depth.labels("pending").set(sum(lanes.values()))
        state.metrics.queue_depth.labels("inflight").set(inflight)
        for lane, pending in lanes.items():
            state.metrics.lane_pending.labels(lane).set(pending)
    except RedisError:
        pass


@router.get("/metrics")
async def metrics(request: Request, state: State) -> Response:
    """Prometheus metrics: behind the API key when the service has keys, or on their own port."""
    if state.settings.metrics_port:
        raise ApiError(404, f"metrics are served on port {state.settings.metrics_port}")
    await require_api_key(request, state)
    await refresh_queue_depth(state)
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
