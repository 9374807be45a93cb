"""One request's trace: the gateway's request span, its wait in the queue and the worker's run with a span
per block cycle, under one trace id. In one process with the SDK's in-memory exporter (a real gateway
served by uvicorn, a real worker, a real redis-server), then through ``dllm serve`` exporting over OTLP/HTTP
to a receiver the test runs (what users configure: ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""

from __future__ import annotations

import openai
import pytest
import redis
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dllm_contracts.queue.keys import ServiceKeys
from dllm_contracts.queue.messages import QueuedRequest
from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from dllm_contracts.tracing import Tracing
from dllm_contracts.tracing_config import TracingConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.worker.config import WorkerConfig
from engine_pod.worker.worker import Worker
from tests.serving.conftest import WorkerThread
from tests.serving.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.serving.serve_process import openai_client, running
from tests.serving_utils import BLOCK, GatewayServer, gateway_settings, wait_for

PROMPT = "count from 1 to 40 ."  # the tiny model answers it in several blocks


def received(span) -> ReceivedSpan:
    """An SDK span as a receiver sees it."""
    parent = format(span.parent.span_id, "016x") if span.parent else ""
    return ReceivedSpan(
        span.resource.attributes["service.name"],
        span.name,
        format(span.context.trace_id, "032x"),
        format(span.context.span_id, "016x"),
        parent,
        span.start_time,
        span.end_time,
        dict(span.attributes),
    )


def check_one_trace(spans: list[ReceivedSpan], route: str) -> ReceivedSpan:
    """The request's spans form one trace rooted at the gateway's span; returns the worker's."""
    [root] = [s for s in spans if s.name == f"POST {route}"]
    [wait] = [s for s in spans if s.name == "queue.wait"]
    [run] = [s for s in spans if s.name == "worker.request"]
    cycles = sorted((s for s in spans if s.name == "block_cycle"), key=lambda s: s.start_ns)
    assert root.service == "dllm-gateway" and root.parent_id == ""
    assert {wait.service, run.service} == {"dllm-worker"} and {c.service for c in cycles} == {"dllm-worker"}
    assert {s.trace_id for s in [root, wait, run, *cycles]} == {root.trace_id}
    assert wait.parent_id == root.span_id and run.parent_id == root.span_id
    assert len(cycles) >= 2 and {c.parent_id for c in cycles} == {run.span_id}
    assert [c.attributes["dllm.block"] for c in cycles] == list(range(len(cycles)))
    # real timestamps: the wait ends at the claim, where the run begins; the cycles fall within the run
    assert wait.start_ns < wait.end_ns <= run.start_ns <= cycles[0].start_ns
    assert cycles[-1].end_ns <= run.end_ns
    assert run.attributes["dllm.finish_reason"] in ("stop", "length")
    return run


@pytest.fixture
def traced_stack(served_model, redis_server, service):
    gateway_spans, worker_spans = InMemorySpanExporter(), InMemorySpanExporter()
    loaded = load_model(str(served_model))
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK)
    config = WorkerConfig(redis_server.url, service, SchedulerConfig(2048), lease_ms=3000)
    worker = Worker(
        make_runner(loaded, decoding),
        config,
        tracing=Tracing.exporting(SimpleSpanProcessor(worker_spans), "dllm-worker"),
    )
    settings = gateway_settings(served_model, redis_server.url, service)
    tracing = Tracing.exporting(SimpleSpanProcessor(gateway_spans), "dllm-gateway")
    with GatewayServer(settings, tracing) as gateway, WorkerThread(worker):
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
        yield client, gateway_spans, worker_spans, redis.Redis.from_url(redis_server.url), service


def test_one_trace_from_the_gateway_through_the_queue_to_the_worker_cycles(traced_stack):
    client, gateway_spans, worker_spans, store, service = traced_stack
    reply = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4 * BLOCK)
    assert reply.usage.completion_tokens > BLOCK

    def spans() -> list[ReceivedSpan]:
        exported = (*gateway_spans.get_finished_spans(), *worker_spans.get_finished_spans())
        return [received(span) for span in exported]

    wait_for(lambda: any(s.name == "worker.request" for s in spans()), what="the worker's span", seen=spans)
    check_one_trace(spans(), "/v1/completions")
    # the payload carried the gateway span's context to the worker
    payload, _, _ = QueuedRequest.read(store.hget(ServiceKeys(service).request(reply.id), "payload"))
    root = next(s for s in spans() if s.service == "dllm-gateway")
    assert payload.trace.startswith(f"00-{root.trace_id}-{root.span_id}-")  # W3C traceparent


def test_untraced_requests_carry_no_trace_context():
    """Tracing off, a payload is what a worker without the ``trace`` field reads (it refuses unknown ones)."""
    request = QueuedRequest("cmpl-1", [1, 2], RequestParams(max_tokens=8), 0.0)
    assert b"trace" not in request.to_json()
    assert QueuedRequest.read(request.to_json())[1] == []
    request.trace = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    assert QueuedRequest.read(request.to_json())[0].trace == request.trace
    assert Tracing.off().enabled is False


@pytest.mark.parametrize(
    ("environ", "url", "name"),
    [
        ({}, None, "dllm-gateway"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
            "http://collector:4318/v1/traces",
            "dllm-gateway",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b/t",
            },
            "http://b/t",
            "dllm-gateway",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_SERVICE_NAME": "chat"},
            "http://a:4318/v1/traces",
            "chat",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_SDK_DISABLED": "true"}, None, "dllm-gateway"),
    ],
)
def test_tracing_is_configured_by_opentelemetry_variables(environ, url, name):
    config = TracingConfig.from_env("dllm-gateway", environ)
    assert (config.traces_url, config.service_name, config.enabled) == (url, name, url is not None)


def test_an_endpoint_that_is_not_http_is_refused_by_name():
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_ENDPOINT must be an http"):
        TracingConfig.from_env("dllm-worker", {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"})


def test_dllm_serve_exports_one_trace_over_otlp(tmp_path):
    """The product path: gateway and worker processes of ``dllm serve``, each exporting to the endpoint
    the standard variable names; a streamed chat request."""
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        with running(tmp_path, env=env) as server:
            stream = openai_client(server).chat.completions.create(
                model="tiny-llada", messages=[{"role": "user", "content": PROMPT}], max_tokens=96, stream=True
            )
            assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            wait_for(
                lambda: (
                    {"worker.request", "POST /v1/chat/completions"} <= {s.name for s in receiver.received()}
                ),
                timeout_s=30,
                what="the gateway's and the worker's spans",
                seen=receiver.received,
            )
        check_one_trace(receiver.received(), "/v1/chat/completions")
