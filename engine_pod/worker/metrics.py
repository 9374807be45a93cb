"""Prometheus metrics of one engine worker (its own registry, so several can live in one process)."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dllm_contracts.latency_metrics import (
    BATCH,
    E2E,
    E2E_HELP,
    LATENCY_BUCKETS,
    PER_TOKEN_BUCKETS,
    WAIT_BUCKETS,
    histogram,
)

# each block cycle's refresh, cache and carry figures (``record_cycle``): attribute -> (kind, name, help)
CYCLE_METRICS = {
    "refresh_positions": (
        Counter,
        "dllm_refresh_positions",
        "Positions computed by refreshes (forwards that rewrite a request's dual cache)",
    ),
    "refresh_share": (Gauge, "dllm_refresh_share", "Refresh positions / computed positions, since start"),
    "peak_refresh_positions": (
        Gauge,
        "dllm_peak_refresh_positions",
        "Most positions one step of the last block cycle refreshed",
    ),
    "refresh_quota_positions": (
        Gauge,
        "dllm_refresh_quota_positions",
        "Most positions one step may refresh (dLLM-Serve's quota; 0: no quota)",
    ),
    "kv_dense_bytes": (
        Counter,
        "dllm_kv_dense_bytes",
        "Bytes of keys and values a dense dual cache would hold for the refreshes computed",
    ),
    "kv_kept_bytes": (
        Counter,
        "dllm_kv_kept_bytes",
        "Of those, the bytes the cache kept (fewer under --sparse-cache)",
    ),
    "kv_kept_share": (
        Gauge,
        "dllm_kv_kept_share",
        "Kept / dense dual-cache bytes of the refreshes since start (1: a dense cache; absent until a "
        "refresh counts its cache's bytes)",
    ),
    "carried_rows": (
        Counter,
        "dllm_carried_rows",
        "Rows whose block went on into the next cycle (dLLM-Serve's step-level batching)",
    ),
    "prefill_chunks": (
        Counter,
        "dllm_prefill_chunks",
        "Prefill chunks computed (a long prompt's keys and values, a chunk per cycle beside decoding rows)",
    ),
    "prefill_chunk_tokens": (
        Counter,
        "dllm_prefill_chunk_tokens",
        "Prompt tokens computed in prefill chunks",
    ),
    "prefill_chunk_wait": (
        Counter,
        "dllm_prefill_chunk_wait_seconds",
        "Time decoding rows waited on prefill chunks (the chunks' share of the forwards they shared)",
    ),
}
LAZY_CYCLE_METRICS = ("kv_kept_share",)  # registered at their first value: absent, not 0, before it


class WorkerMetrics:
    def __init__(self, model: str = "") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.model = model  # the served model's name: the latency histograms' model label
        # the latency of requests (engine_pod.worker.observed observes them), by model and lane
        self.queue_wait = histogram(
            r,
            "dllm_queue_wait_seconds",
            "From a request's enqueue to its claim by a worker (Redis's clock; a request handed back before "
            "its first block counts again when claimed again)",
            WAIT_BUCKETS,
            model,
        )
        self.time_to_first_block = histogram(
            r,
            "dllm_time_to_first_block_seconds",
            "From a request's enqueue to its first block recorded in Redis (readable by the gateway)",
            LATENCY_BUCKETS,
            model,
        )
        self.time_per_output_token = histogram(
            r,
            "dllm_time_per_output_token_seconds",
            "After the first block: seconds to the result per completion token not in the first block",
            PER_TOKEN_BUCKETS,
            model,
        )
        self.e2e = histogram(r, E2E, E2E_HELP, LATENCY_BUCKETS, model, (BATCH,))  # batch lines only
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
        self.logits_materialized = Counter(
            "dllm_logits_materialized",
            "LM head outputs computed: positions x vocabulary entries (x k with --logit-candidates)",
            registry=r,
        )
        self.peak_logits = Gauge(
            "dllm_logits_at_once",
            "The most LM head outputs that existed at once in the last block cycle (one chunk of positions: "
            "--max-materialized-logits bounds it)",
            registry=r,
        )
        self.preemptions = Counter(
            "dllm_preemptions", "Rows sent back to the local queue by the budget", registry=r
        )
        self.prefix_cached_tokens = Gauge(
            "dllm_prefix_cache_tokens", "Tokens whose KV the block prefix cache holds", registry=r
        )
        self.prefix_pinned_tokens = Gauge(
            "dllm_prefix_cache_pinned_tokens",
            "Tokens of warm prefixes (--warm-prefix) computed at start and pinned in the block prefix cache",
            registry=r,
        )
        self.prefix_lookup_tokens = Counter(
            "dllm_prefix_cache_lookup_tokens",
            "Whole-block tokens of rows entering the batch, looked up in the prefix cache",
            registry=r,
        )
        self.prefix_hit_tokens = Counter(
            "dllm_prefix_cache_hit_tokens",
            "Of those, found cached (hit rate: hit / lookup tokens)",
            registry=r,
        )
        self.prefix_hits = Histogram(
            "dllm_prefix_cache_hit_tokens_per_request",
            "Tokens found cached when a request's row entered the batch",
            buckets=(0, 32, 128, 512, 1024, 2048, 4096, 8192, 16384),
            registry=r,
        )
        self.prefix_evicted_tokens = Counter(
            "dllm_prefix_cache_evicted_tokens", "Tokens evicted from the prefix cache", registry=r
        )
        for attribute, (kind, name, description) in CYCLE_METRICS.items():
            lazy = attribute in LAZY_CYCLE_METRICS
            setattr(self, attribute, None if lazy else kind(name, description, registry=r))
        self._useful = 0
        self._computed = 0
        self._dense = self._kept = 0  # dual-cache bytes, dense and kept, since start
        self._refreshed = 0
        self._seen = None  # the prefix cache's totals at the last scrape of them

    def record_cycle(self, record, seconds: float) -> None:
        """A block cycle (the engine's CycleRecord) that took ``seconds`` on this worker's loop: its rows,
        box, padding, preemptions and refreshes (the refresh positions, its largest step's and its quota)."""
        self.active_rows.set(record.rows)
        self.box_width.set(record.box_width)
        self.cycle_seconds.observe(seconds)
        self.preemptions.inc(record.preempted)
        self._useful += record.useful_positions
        self._computed += record.computed_positions
        if self._computed:
            self.padding_efficiency.set(self._useful / self._computed)
        refreshed, peak, quota = record.refresh_positions, record.peak_refresh_positions, record.refresh_quota
        self.refresh_positions.inc(refreshed)
        self._refreshed += refreshed
        if self._computed:
            self.refresh_share.set(self._refreshed / self._computed)
        self.peak_refresh_positions.set(peak)
        self.refresh_quota_positions.set(quota or 0)
        self.carried_rows.inc(record.carried)
        self.prefill_chunks.inc(record.prefill_chunks)
        self.prefill_chunk_tokens.inc(record.prefill_chunk_tokens)
        self.prefill_chunk_wait.inc(record.chunk_wait_s)
        self.kv_dense_bytes.inc(record.kv_dense_bytes)
        self.kv_kept_bytes.inc(record.kv_kept_bytes)
        self._dense += record.kv_dense_bytes
        self._kept += record.kv_kept_bytes
        if self._dense:
            if self.kv_kept_share is None:
                kind, name, description = CYCLE_METRICS["kv_kept_share"]
                self.kv_kept_share = kind(name, description, registry=self.registry)
            self.kv_kept_share.set(self._kept / self._dense)

    def record_logits(self, materialized: int, peak: int) -> None:
        """One block cycle's logits (CycleStats.logits_materialized and peak_logits)."""
        self.logits_materialized.inc(materialized)
        self.peak_logits.set(peak)

    def record_prefix_cache(self, stats, hits: dict[str, int]) -> None:
        """The prefix cache's totals (PrefixCacheStats) and the last cycle's hits, per entering row."""
        seen = self._seen
        self.prefix_cached_tokens.set(stats.cached_tokens)
        self.prefix_lookup_tokens.inc(stats.looked_up_tokens - (seen.looked_up_tokens if seen else 0))
        self.prefix_hit_tokens.inc(stats.hit_tokens - (seen.hit_tokens if seen else 0))
        self.prefix_evicted_tokens.inc(stats.evicted_tokens - (seen.evicted_tokens if seen else 0))
        for tokens in hits.values():
            self.prefix_hits.observe(tokens)
        self._seen = replace(stats)
