"""What the worker records of each request it serves: its latencies (the histograms of ``WorkerMetrics``)
and, when the gateway sent a trace context, its spans.

Clocks: Redis measured the request's wait (``Claimed.queued_s``, from its first enqueue to the candidates'
read, on Redis's clock); everything after the claim is this worker's monotonic clock. So its enqueue is
placed on the worker's clock as ``claim - wait``, and no two machines' clocks are compared.

Spans, children of the gateway's request span: ``queue.wait`` (enqueue to claim, stamped when claimed),
``worker.request`` (claim to result) and under it one ``block_cycle`` per block cycle the request took part
in (a cycle serves many requests: each gets a child span over the cycle's interval, with its block's
number and the cycle's rows).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dllm_contracts.latency_metrics import BATCH, lane_of
from dllm_contracts.queue.messages import DoneEvent
from dllm_contracts.queue.ops import BlockCommit, Claimed
from dllm_contracts.tracing import Tracing, context_of, end_span
from engine_pod.worker.metrics import WorkerMetrics


@dataclass
class _Timing:
    lane: str
    enqueued: float  # monotonic: its first enqueue, on this worker's clock (claim minus its wait)
    fresh: bool  # claimed with nothing committed: its first block is this worker's
    first_block_at: float | None = None  # monotonic: when Redis recorded its first block
    first_tokens: int = 0  # tokens in its first block
    span: Any = None  # its run on this worker (tracing on, and the gateway sent a context)


class RequestObserver:
    def __init__(self, metrics: WorkerMetrics, tracing: Tracing, worker_id: str) -> None:
        self.metrics, self.tracing, self.worker_id = metrics, tracing, worker_id
        self._live: dict[str, _Timing] = {}  # claimed and not yet finished or dropped (bounded by them)

    def claimed(self, claimed: Claimed) -> None:
        """Just claimed: its wait in the queue observed (the first time it is claimed with nothing done)."""
        request, waited = claimed.request, claimed.queued_s
        timing = _Timing(lane_of(request.batch_id), time.monotonic() - (waited or 0.0), not claimed.generated)
        if timing.fresh and waited is not None:
            self.metrics.queue_wait.labels(self.metrics.model, timing.lane).observe(waited)
        if self.tracing.enabled and request.trace:
            timing.span = self._start_spans(claimed, timing.lane, waited or 0.0)
        self._live[request.id] = timing

    def recorded(self, blocks: list[BlockCommit], lost: set[str]) -> None:
        """Redis recorded ``blocks`` (but those of ``lost`` requests): a request's first one ends its time
        to first block."""
        now = time.monotonic()
        for block in blocks:
            timing = self._live.get(block.request_id)
            if (
                timing is None
                or not timing.fresh
                or timing.first_block_at is not None
                or block.request_id in lost
            ):
                continue
            timing.first_block_at, timing.first_tokens = now, len(block.generated)
            self.metrics.time_to_first_block.labels(self.metrics.model, timing.lane).observe(
                now - timing.enqueued
            )

    def cycle(self, blocks: list[BlockCommit], begin_ns: int, end_ns: int, rows: int) -> None:
        """A block cycle that committed ``blocks``: a child span of each traced request's run."""
        if not self.tracing.enabled:
            return
        from opentelemetry import trace

        for block in blocks:
            timing = self._live.get(block.request_id)
            if timing is None or timing.span is None:
                continue
            attributes = {"dllm.block": block.index, "dllm.cycle.rows": rows}
            parent = trace.set_span_in_context(timing.span)
            span = self.tracing.tracer.start_span(
                "block_cycle", parent, start_time=begin_ns, attributes=attributes
            )
            span.end(end_time=end_ns)

    def finished(self, request_id: str, done: DoneEvent) -> None:
        """Its result acknowledged by Redis: time per output token, a batch line's end to end, its span."""
        timing = self._live.pop(request_id, None)
        if timing is None:
            return
        now, model = time.monotonic(), self.metrics.model
        after_first = done.completion_tokens - timing.first_tokens
        if timing.first_block_at is not None and after_first > 0:
            self.metrics.time_per_output_token.labels(model, timing.lane).observe(
                (now - timing.first_block_at) / after_first
            )
        if timing.lane == BATCH:
            self.metrics.e2e.labels(model, BATCH).observe(now - timing.enqueued)
        if timing.span is not None:
            timing.span.set_attribute("dllm.finish_reason", done.finish_reason)
            timing.span.set_attribute("dllm.completion_tokens", done.completion_tokens)
            end_span(timing.span)

    def forget(self, request_id: str) -> None:
        """Another worker owns it now, or its result was delivered elsewhere: nothing more to observe."""
        timing = self._live.pop(request_id, None)
        if timing is not None:
            end_span(timing.span)

    def _start_spans(self, claimed: Claimed, lane: str, waited: float) -> Any:
        from opentelemetry.trace import SpanKind

        request, tracer = claimed.request, self.tracing.tracer
        parent, now_ns = context_of(request.trace), time.time_ns()
        attributes = {"dllm.request_id": request.id, "dllm.lane": lane, "dllm.worker": self.worker_id}
        wait = tracer.start_span(
            "queue.wait", parent, start_time=now_ns - int(waited * 1e9), attributes=attributes
        )
        wait.end(end_time=now_ns)
        attributes["dllm.committed_tokens"] = len(claimed.generated)
        return tracer.start_span("worker.request", parent, SpanKind.CONSUMER, attributes, start_time=now_ns)
