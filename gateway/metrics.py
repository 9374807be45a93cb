"""Prometheus metrics of the gateway."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "dllm_gateway_requests", "HTTP requests", ["endpoint", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "dllm_gateway_request_seconds",
            "Time from acceptance to the last byte",
            ["endpoint"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "dllm_queue_depth", "Requests in the service queue", ["state"], registry=self.registry
        )
        self.lane_pending = Gauge(
            "dllm_queue_lane_pending",
            "Pending requests per lane (interactive requests are claimed before batch lines)",
            ["lane"],
            registry=self.registry,
        )
        self.waiting = Gauge(
            "dllm_gateway_waiting_requests",
            "Queued requests whose events this gateway is reading (each choice counts)",
            registry=self.registry,
        )
        self.rejected = Counter("dllm_gateway_rejected", "Requests refused with 429", registry=self.registry)

    def count_request(self, route: str, status: int) -> None:
        """An HTTP response, by route template ("unmatched": none) and status."""
        self.requests.labels(route, str(status)).inc()
