"""The chart's alert rules as ``promtool test rules`` cases, on series a real ``dllm serve`` exports: every
input series is a sample of a real /metrics scrape (its name and its labels; a label's value may be set to
another the product uses, such as a status of 503), plus the labels Prometheus gives a scraped target.

Each alert has a case where it must fire and one where it must stay silent; ``ALERTS`` lists them, and
the test checks that every rule the chart renders has both."""

from __future__ import annotations

from dataclasses import dataclass, field

TARGET = {"namespace": "serving", "pod": "p-0"}  # what Prometheus adds to a scraped pod's series
EVAL = "30m"  # when each case is evaluated: past the rules' 5m rates and their ``for`` (10m by default)
RUN = "0+{per_minute}x40"  # a counter growing by per_minute every minute, for 40 minutes
FLAT = "0x40"
LATENCY_ALERTS = {  # alert -> (histogram, its threshold's name in the chart's values)
    "DLLMQueueWaitHigh": ("dllm_queue_wait_seconds", "queueWaitSeconds"),
    "DLLMTimeToFirstBlockHigh": ("dllm_time_to_first_block_seconds", "timeToFirstBlockSeconds"),
    "DLLMTimePerOutputTokenHigh": ("dllm_time_per_output_token_seconds", "timePerOutputTokenSeconds"),
    "DLLMEndToEndLatencyHigh": ("dllm_request_e2e_seconds", "endToEndSeconds"),
}


def selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


@dataclass
class Exported:
    """The samples of real scrapes (sample name -> samples), to take input series from."""

    samples: dict[str, list] = field(default_factory=dict)

    @classmethod
    def of(cls, *scrapes: dict[str, list]) -> Exported:
        """The samples of ``scrapes`` (several processes'), one of each name and label set."""
        merged: dict[str, dict] = {}
        for scrape in scrapes:
            for name, samples in scrape.items():
                for sample in samples:
                    merged.setdefault(name, {}).setdefault(tuple(sorted(sample.labels.items())), sample)
        return cls({name: list(samples.values()) for name, samples in merged.items()})

    def labels(self, name: str, match: dict[str, str] | None = None, values: dict | None = None) -> dict:
        """The labels of the first exported ``name`` sample whose labels include ``match``, with ``values``
        set over labels it has (never a label it lacks), and the target's."""
        match = match or {}
        found = [s for s in self.samples.get(name, []) if match.items() <= s.labels.items()]
        if not found:
            seen = [s.labels for s in self.samples.get(name, [])]
            raise KeyError(f"no exported {name} sample with labels {match}; exported: {seen}")
        labels = dict(found[0].labels)
        unknown = set(values or {}) - set(labels)
        if unknown:
            raise KeyError(f"{name} has no label {sorted(unknown)}; its labels: {sorted(labels)}")
        return labels | (values or {}) | TARGET

    def series(self, name: str, values: str, match: dict | None = None, set_: dict | None = None) -> dict:
        return {"series": selector(name, self.labels(name, match, set_)), "values": values}

    def histogram(self, name: str, match: dict[str, str], slow_from: float | None) -> list[dict]:
        """Every bucket of the exported histogram ``name`` (labels ``match``) counting 10 observations a
        minute: each of them above ``slow_from`` when given, else in the first bucket."""
        buckets = [s for s in self.samples.get(f"{name}_bucket", []) if match.items() <= s.labels.items()]
        if not buckets:
            raise KeyError(f"no exported {name}_bucket with labels {match}")
        bounds = sorted(float(s.labels["le"]) for s in buckets)
        if slow_from is None:
            first = bounds[0]
        else:  # the first bucket whose lower bound is at least slow_from: its p95 lies above it
            first = next(
                upper for lower, upper in zip(bounds, bounds[1:], strict=False) if lower >= slow_from
            )
        series = []
        for bucket in buckets:
            counted = float(bucket.labels["le"]) >= first
            labels = dict(bucket.labels) | TARGET
            series.append(
                {
                    "series": selector(bucket.name, labels),
                    "values": RUN.format(per_minute=10) if counted else FLAT,
                }
            )
        return series


def case(name: str, series: list[dict], alert: str, fires: dict[str, str] | None) -> dict:
    """One promtool test: ``alert`` evaluated at ``EVAL`` on ``series``; ``fires``: the labels it fires
    with (besides its own), None: it must be silent."""
    expected = [] if fires is None else [{"exp_labels": fires}]
    return {
        "name": name,
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [{"eval_time": EVAL, "alertname": alert, "exp_alerts": expected}],
    }


def alert_cases(exported: Exported, thresholds: dict, severity: dict[str, str]) -> list[dict]:
    """The cases of every alert: ``thresholds`` are the chart's values, ``severity`` each alert's label."""
    ns = {"namespace": TARGET["namespace"]}

    def fires(alert: str, **labels: str) -> dict[str, str]:
        return ns | labels | {"severity": severity[alert]}

    cases = []
    model = exported.labels("dllm_queue_wait_seconds_count", {"lane": "interactive"})["model"]
    for alert, (histogram, threshold) in LATENCY_ALERTS.items():
        lane = {"lane": "interactive"}
        slow = exported.histogram(histogram, lane, float(thresholds[threshold]))
        fast = exported.histogram(histogram, lane, None)
        cases.append(case(f"{alert}: slow", slow, alert, fires(alert, model=model)))
        cases.append(case(f"{alert}: fast", fast, alert, None))
        batch = exported.histogram(histogram, {"lane": "batch"}, float(thresholds[threshold]))
        cases.append(case(f"{alert}: a slow batch lane is no alert", batch, alert, None))
    cases += _availability_cases(exported, thresholds, fires)
    cases += _queue_cases(exported, fires)
    return cases


def _availability_cases(exported: Exported, thresholds: dict, fires) -> list[dict]:
    completed = "dllm_requests_completed_total"
    stop = exported.series(completed, RUN.format(per_minute=60), {"finish_reason": "stop"})
    errors = exported.series(completed, RUN.format(per_minute=60), set_={"finish_reason": "error"})
    responses = "dllm_gateway_requests_total"
    ok = exported.series(responses, RUN.format(per_minute=60), {"status": "200"})
    failing = exported.series(responses, RUN.format(per_minute=60), {"status": "200"}, {"status": "503"})
    assert float(thresholds["failedRatio"]) < 0.5 and float(thresholds["serverErrorRatio"]) < 0.5
    return [
        case(
            "errors: half the requests", [stop, errors], "DLLMRequestsFailing", fires("DLLMRequestsFailing")
        ),
        case("errors: none", [stop], "DLLMRequestsFailing", None),
        case("5xx: half", [ok, failing], "DLLMGatewayServerErrors", fires("DLLMGatewayServerErrors")),
        case("5xx: none", [ok], "DLLMGatewayServerErrors", None),
    ]


def _queue_cases(exported: Exported, fires) -> list[dict]:
    rejected, depth = "dllm_gateway_rejected_total", "dllm_queue_depth"
    tenant_refusals = [
        exported.series(rejected, RUN.format(per_minute=30), {"reason": reason})
        for reason in ("rpm", "tpm", "concurrency", "batch_lines", "storage")
    ]
    queue_full = exported.series(rejected, RUN.format(per_minute=30), {"reason": "queue_full"})
    not_full = exported.series(rejected, FLAT, {"reason": "queue_full"})
    empty = exported.series(depth, FLAT, {"state": "pending"})
    pending = exported.series(depth, "5x40", {"state": "pending"})
    generating = exported.series("dllm_generated_tokens_total", RUN.format(per_minute=600))
    idle = exported.series("dllm_generated_tokens_total", FLAT)
    full, stalled = "DLLMQueueFull", "DLLMQueueStalled"
    return [
        case("tenants at their own limits, empty queue", [*tenant_refusals, not_full, empty], full, None),
        case("the queue full", [queue_full, pending, generating], full, fires(full)),
        case("queued, no engine scraped", [pending], stalled, fires(stalled)),
        case("queued, engines scraped but not generating", [pending, idle], stalled, fires(stalled)),
        case("queued, engines generating", [pending, generating], stalled, None),
        case("nothing queued, no engine scraped", [empty], stalled, None),
    ]
