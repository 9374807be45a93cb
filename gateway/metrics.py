"""Prometheus metrics of the gateway."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dllm_contracts.latency_metrics import E2E, E2E_HELP, INTERACTIVE, LATENCY_BUCKETS, histogram

# why a request was refused (the rejections counter's ``reason`` label: these values only): the service's
# queue was full, or the caller's key was at one of its limits
QUEUE_FULL, RPM, TPM, CONCURRENCY, BATCH_LINES, STORAGE = (
    "queue_full",
    "rpm",
    "tpm",
    "concurrency",
    "batch_lines",
    "storage",
)
REJECTION_REASONS = (QUEUE_FULL, RPM, TPM, CONCURRENCY, BATCH_LINES, STORAGE)


class GatewayMetrics:
    def __init__(self, model: str = "") -> None:
        self.registry = CollectorRegistry()
        self.model = model  # the served model's name: the latency histograms' model label
        # client-visible, per API request (the worker observes a batch line's instead: counted once)
        self.e2e = histogram(self.registry, E2E, E2E_HELP, LATENCY_BUCKETS, model, (INTERACTIVE,))
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
        self.rejected = Counter(
            "dllm_gateway_rejected",
            "Requests refused by a limit, by reason: queue_full (the service's queue is at DLLM_MAX_QUEUED: "
            "429), or the caller's key at its rpm, tpm, concurrency, batch_lines (429) or storage (400)",
            ["reason"],
            registry=self.registry,
        )
        for reason in REJECTION_REASONS:  # every series from the start: a rule sees 0, not nothing
            self.rejected.labels(reason)

    def observe_e2e(self, seconds: float) -> None:
        self.e2e.labels(self.model, INTERACTIVE).observe(seconds)

    def count_rejection(self, reason: str) -> None:
        """A request refused by a limit, for ``reason`` (one of ``REJECTION_REASONS``)."""
        if reason not in REJECTION_REASONS:
            raise ValueError(f"unknown rejection reason {reason!r} (known: {', '.join(REJECTION_REASONS)})")
        self.rejected.labels(reason).inc()

    def count_request(self, route: str, status: int) -> None:
        """An HTTP response, by route template ("unmatched": none) and status."""
        self.requests.labels(route, str(status)).inc()
