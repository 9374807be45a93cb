"""The request latency histograms' names, labels and buckets, shared by the gateway and the worker.

Labels are ``model`` (the served model's name) and ``lane`` (``interactive`` or ``batch``) only: bounded
sets, so a series per model and lane, never per tenant or request. Buckets span what a diffusion LLM
takes: a block in milliseconds, a long answer in minutes, a batch line's wait up to hours (a batch's
completion window is a day; longer falls in +Inf).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

LABELS = ("model", "lane")
INTERACTIVE, BATCH = "interactive", "batch"
LANES = (INTERACTIVE, BATCH)

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400)
WAIT_BUCKETS = (0.001, 0.005, *LATENCY_BUCKETS)  # a claim can follow its enqueue within a millisecond
PER_TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

E2E = "dllm_request_e2e_seconds"
E2E_HELP = (
    "End to end: an interactive request from its arrival at the gateway to its answer's last byte "
    "(the gateway's); a batch line from its enqueue to its result's commit (the worker's)"
)


def lane_of(batch_id: str) -> str:
    return BATCH if batch_id else INTERACTIVE


def histogram(
    registry: CollectorRegistry, name: str, documentation: str, buckets: tuple, model: str, lanes=LANES
) -> Histogram:
    """A latency histogram by model and lane, its series for ``model`` in ``lanes`` present from the start
    (at zero), so that dashboards and alerts see them before the first request."""
    family = Histogram(name, documentation, LABELS, buckets=buckets, registry=registry)
    for lane in lanes:
        family.labels(model, lane)
    return family
