"""Prometheus metrics of one engine worker (its own registry, so several can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.generated_tokens = Counter(
            "dllm_generated_tokens", "Tokens generated (up to and including EOS)", registry=r
        )
        self.requests = Counter(
            "dllm_requests_completed", "Requests completed", ["finish_reason"], registry=r
        )
        self.queue_depth = Gauge("dllm_queue_depth", "Requests in the service queue", ["state"], registry=r)
        self.active_rows = Gauge("dllm_active_rows", "Rows in the last block cycle", registry=r)
        self.box_width = Gauge("dllm_box_width", "Bounding-box width of the last block cycle", registry=r)
        self.token_budget = Gauge("dllm_token_budget", "Token budget of this worker", registry=r)
        self.padding_efficiency = Gauge(
            "dllm_padding_efficiency", "Useful token positions / computed positions, since start", registry=r
        )
        self.cycle_seconds = Histogram(
            "dllm_block_cycle_seconds",
            "Wall time of one block cycle",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.preemptions = Counter(
            "dllm_preemptions", "Rows sent back to the local queue by the budget", registry=r
        )
        self._useful = 0
        self._computed = 0

    def record_cycle(
        self, rows: int, box_width: int, seconds: float, useful: int, computed: int, preempted: int
    ) -> None:
        self.active_rows.set(rows)
        self.box_width.set(box_width)
        self.cycle_seconds.observe(seconds)
        self.preemptions.inc(preempted)
        self._useful += useful
        self._computed += computed
        if self._computed:
            self.padding_efficiency.set(self._useful / self._computed)
