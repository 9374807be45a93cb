"""``build_app(settings)``: the FastAPI application; its lifespan owns the Redis pool and the tokenizer."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import start_http_server
from redis.exceptions import RedisClusterException

from dllm_contracts.heap import collect_young_less_often, freeze_loaded_objects
from dllm_contracts.queue.async_client import AsyncQueue
from dllm_contracts.queue.connect import async_client
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.resilience import CLIENT_OPTIONS, TRANSIENT_ERRORS, is_loading
from dllm_contracts.tracing import Tracing
from dllm_contracts.tracing_config import TracingConfig
from gateway.api_keys import ApiKeys
from gateway.batch_keeper import BatchKeeper, new_gateway_id
from gateway.body_limit import BodyLimit
from gateway.coalesced_calls import CoalescedCalls
from gateway.delivered import DeliveredEvents
from gateway.errors import install_error_handlers
from gateway.event_reader import EventReader
from gateway.fast_path import FastPath, is_hot
from gateway.file_store import FileStore, open_store
from gateway.file_sweeper import sweep_files_forever
from gateway.metrics import GatewayMetrics
from gateway.routers import batches, completions, files, health, models
from gateway.routers.health import refresh_queue_depth
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.tokenizer import GatewayTokenizer

logger = logging.getLogger(__name__)
TRACED_AS = "dllm-gateway"  # the traces' service.name unless OTEL_SERVICE_NAME says otherwise


def build_app(
    settings: GatewaySettings, metrics_server: bool = True, tracing: Tracing | None = None
) -> HotPath:
    """``metrics_server=False``: no server on ``settings.metrics_port`` (one of several processes sharing
    the API port leaves it to the first); ``tracing``: where spans go (default: OpenTelemetry's
    variables say, ``TracingConfig``)."""
    tokenizer = GatewayTokenizer(settings.model_dir)
    api_keys = ApiKeys(settings)  # a keys file that cannot be read stops the start here
    store = _file_store(settings)
    if tracing is None:
        tracing = Tracing.start(TracingConfig.from_env(TRACED_AS))  # a malformed endpoint stops it here

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client = async_client(settings.redis_url, max_connections=4096, **CLIENT_OPTIONS)
        queue = AsyncQueue(client, QueueOps(settings.service, result_ttl_s=settings.result_ttl_s))
        try:
            await queue.prepare()
        except (*TRANSIENT_ERRORS, RedisClusterException) as exc:  # serve anyway: /readyz says not ready
            state = "loading its data" if is_loading(exc) else "not reachable"
            logger.warning("Redis %s at start (%s); not ready until it answers", state, exc)
        reader, delivered = EventReader(queue), DeliveredEvents(queue)
        calls = CoalescedCalls(queue)
        metrics = GatewayMetrics(settings.served_model)
        metrics.waiting.set_function(reader.waiting)
        state = GatewayState(
            settings, tokenizer, client, queue, metrics, calls, reader, delivered, api_keys, store
        )
        state.tracing = tracing
        state.batches = BatchKeeper(state, new_gateway_id())
        app.state.gateway = state
        _reload_keys_on_sighup(api_keys)
        background = [asyncio.create_task(reader.run()), asyncio.create_task(delivered.run())]
        background.append(asyncio.create_task(state.batches.run()))
        if settings.api_keys_file and settings.api_keys_reload_s > 0:
            background.append(api_keys.start_watching())
        background.append(asyncio.create_task(sweep_files_forever(state)))
        for task in background:
            task.add_done_callback(_report_failure)
        freeze_loaded_objects()
        collect_young_less_often()
        metrics_thread = (
            _serve_metrics(app.state.gateway) if settings.metrics_port and metrics_server else None
        )
        logger.info(
            "gateway for service %s (model %s) on %s",
            settings.service,
            settings.served_model,
            settings.redis_url,
        )
        try:
            yield
        finally:
            for task in list(app.state.gateway.tasks):
                task.cancel()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await state.batches.release()
            if metrics_thread is not None:
                metrics_thread.shutdown()
            await client.aclose()
            tracing.shutdown()

    docs = settings.docs
    app = FastAPI(
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
        title="dllm gateway",
        description="OpenAI-style API for diffusion LLMs served with BlockServe (greedy unless a temperature is set).",
        version="0.1.0",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    for router in (completions.router, models.router, files.router, batches.router, health.router):
        app.include_router(router)

    app.add_middleware(BodyLimit, settings=settings)
    app.add_middleware(RequestCounter)
    return HotPath(app, settings)


class HotPath:
    """The outermost application: the two endpoints that carry the load go through the request counter,
    the body limit and ``FastPath`` only, not through the FastAPI stack's other layers (each wraps every
    message a stream sends); everything else, and the lifespan, go to the FastAPI app. Attributes are the
    FastAPI app's (``state``, ``routes``, ``openapi()``)."""

    def __init__(self, app: FastAPI, settings: GatewaySettings) -> None:
        self.fastapi = app
        self.hot = RequestCounter(BodyLimit(FastPath(), settings))

    async def __call__(self, scope, receive, send) -> None:
        if is_hot(scope):
            scope["app"] = self.fastapi  # what the handlers find their state in
            await self.hot(scope, receive, send)
        else:
            await self.fastapi(scope, receive, send)

    def __getattr__(self, name: str):
        return getattr(self.fastapi, name)


def _file_store(settings: GatewaySettings) -> FileStore:
    """The file store the settings name (a directory is made here: one that cannot be stops the start)."""
    try:
        store = open_store(settings.file_store, settings.s3_endpoint_url)
    except OSError as exc:
        raise ValueError(f"the file store {settings.file_store} cannot be used: {exc.strerror}") from None
    logger.info("files kept in %s", store.describe())
    return store


def _reload_keys_on_sighup(api_keys: ApiKeys) -> None:
    """SIGHUP re-reads the keys file (only where the app runs in the main thread, as ``python -m gateway``
    does; elsewhere signals are not this app's)."""
    if not api_keys.settings.api_keys_file or threading.current_thread() is not threading.main_thread():
        return
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, api_keys.reload)


def _report_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("gateway task %s failed", task.get_coro(), exc_info=task.exception())


METRICS_REFRESH_S = 5.0  # how often the queue depth is read for a metrics port of its own


def _serve_metrics(state: GatewayState):
    """/metrics on ``settings.metrics_port`` (a thread of prometheus_client's), and a task that keeps the
    queue depth gauge current for it."""
    settings = state.settings
    server, _ = start_http_server(
        settings.metrics_port, addr=settings.metrics_host, registry=state.metrics.registry
    )

    async def refresh() -> None:
        while True:
            await refresh_queue_depth(state)
            await asyncio.sleep(METRICS_REFRESH_S)

    state.spawn(refresh())
    logger.info("metrics on %s:%d", settings.metrics_host, settings.metrics_port)
    return server


class RequestCounter:
    """Counts every HTTP response by route template and status (pure ASGI: Starlette's BaseHTTPMiddleware
    costs a task group and memory streams per request). A URL no route matched counts as "unmatched", so
    the series stay bounded whatever clients send."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = []

        async def send_counting(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            state = getattr(scope["app"].state, "gateway", None) if "app" in scope else None
            if state is not None and status:
                route = getattr(scope.get("route"), "path", "unmatched")
                state.metrics.count_request(route, status[0])
