"""The gateway's span of an API request (the root of its trace), and the trace context its queued requests
carry to the worker (``QueuedRequest.trace``). Tracing off: no span, nothing carried, nothing imported."""

from __future__ import annotations

from dllm_contracts.queue.messages import QueuedRequest
from dllm_contracts.tracing import end_span, traceparent_of

ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


async def traced(state, endpoint: str, handler, body, *args):
    """``handler(body, state, *args, span=span)`` under the request's span: the handler ends it when its
    answer is complete (a stream: after its last event); an error ends it here."""
    span = _start(state, endpoint, body)
    try:
        return await handler(body, state, *args, span=span)
    except BaseException as exc:
        end_span(span, exc)
        raise


def _start(state, endpoint: str, body):
    if not state.tracing.enabled:
        return None
    from opentelemetry.trace import SpanKind

    route = ROUTES[endpoint]
    attributes = {"http.request.method": "POST", "http.route": route, "dllm.model": body.model}
    attributes["dllm.stream"] = bool(body.stream)
    return state.tracing.tracer.start_span(f"POST {route}", kind=SpanKind.SERVER, attributes=attributes)


def carry(queued: list[QueuedRequest], span) -> None:
    """Each queued request names ``span`` as its parent (no span: they carry nothing)."""
    if span is None:
        return
    traceparent = traceparent_of(span)
    span.set_attribute("dllm.request_ids", [request.id for request in queued])
    for request in queued:
        request.trace = traceparent
