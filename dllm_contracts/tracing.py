"""OpenTelemetry traces of a request, from the gateway through the queue to the worker's block cycles.

One trace per API request: the gateway's request span (SERVER) is its root; every queued request carries
the span's W3C ``traceparent`` in its payload (``QueuedRequest.trace``), and the worker that claims it
records, under that parent, the wait in the queue (enqueue to claim, stamped after the fact with the
wait Redis measured) and its run on the worker (claim to result), with one child span per block cycle the
request took part in (a cycle serves many requests: each gets its own child span over the same interval).

Off unless an OTLP endpoint is configured (``TracingConfig``): then ``Tracing.off()`` has no tracer, the
OpenTelemetry SDK is never imported, no span is built and no payload carries a trace. Torch-free.
"""

from __future__ import annotations

import logging
from typing import Any

from dllm_contracts.tracing_config import TracingConfig

logger = logging.getLogger(__name__)
TRACEPARENT = "traceparent"


class Tracing:
    """A tracer and the provider that exports its spans; both None when tracing is off."""

    def __init__(self, tracer: Any = None, provider: Any = None) -> None:
        self.tracer, self.provider = tracer, provider

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    @classmethod
    def off(cls) -> Tracing:
        return cls()

    @classmethod
    def start(cls, config: TracingConfig) -> Tracing:
        """Spans batched and sent over OTLP/HTTP to the configured endpoint, or no tracer at all."""
        if not config.enabled:
            return cls.off()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        logger.info("sending traces to %s as %s", config.traces_url, config.service_name)
        return cls.exporting(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=config.traces_url)), config.service_name
        )

    @classmethod
    def exporting(cls, processor: Any, service_name: str) -> Tracing:
        """Spans handed to ``processor`` (a test's ``SimpleSpanProcessor(InMemorySpanExporter())``)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(processor)
        return cls(provider.get_tracer("dllm"), provider)

    def shutdown(self) -> None:
        """Send what is left (bounded by the exporter's timeout); tracing off: nothing."""
        if self.provider is not None:
            self.provider.shutdown()


def traceparent_of(span: Any) -> str | None:
    """The W3C ``traceparent`` naming ``span`` as the parent (None: no span)."""
    if span is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def context_of(traceparent: str | None) -> Any:
    """The parent context a ``traceparent`` names (an invalid or absent one: a new trace)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({TRACEPARENT: traceparent} if traceparent else {})


def end_span(span: Any, error: BaseException | None = None, end_time: int | None = None) -> None:
    """End ``span`` (None: nothing), marked as failed with ``error``'s type when there is one."""
    if span is None:
        return
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.end(end_time=end_time)
