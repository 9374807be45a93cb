"""``build_app(settings)``: the FastAPI application; its lifespan owns the Redis pool and the tokenizer."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from redis.exceptions import RedisClusterException

from engine_pod.queue.async_client import AsyncQueue
from engine_pod.queue.connect import async_client
from engine_pod.queue.ops import QueueOps
from engine_pod.queue.resilience import CLIENT_OPTIONS, TRANSIENT_ERRORS
from gateway.errors import install_error_handlers
from gateway.metrics import GatewayMetrics
from gateway.routers import batches, completions, health, models
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.tokenizer import GatewayTokenizer

logger = logging.getLogger(__name__)


def build_app(settings: GatewaySettings) -> FastAPI:
    tokenizer = GatewayTokenizer(settings.model_dir)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client = async_client(settings.redis_url, max_connections=4096, **CLIENT_OPTIONS)
        queue = AsyncQueue(client, QueueOps(settings.service, result_ttl_s=settings.result_ttl_s))
        try:
            await queue.prepare()
        except (*TRANSIENT_ERRORS, RedisClusterException) as exc:  # serve anyway: /readyz says not ready
            logger.warning("Redis not reachable at start (%s); connecting on first use", exc)
        app.state.gateway = GatewayState(settings, tokenizer, client, queue, GatewayMetrics())
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
            await client.aclose()

    app = FastAPI(
        title="dllm gateway",
        description="OpenAI-style API for diffusion LLMs served with BlockServe. Decoding is greedy.",
        version="0.1.0",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    for router in (completions.router, models.router, batches.router, health.router):
        app.include_router(router)

    @app.middleware("http")
    async def count_requests(request, call_next):
        response = await call_next(request)
        if hasattr(app.state, "gateway"):
            app.state.gateway.metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        return response

    return app
