"""Online load: when each request arrives (Poisson at a rate, seeded, or a closed loop of C clients), and
what a user sees of each (queue wait, time to the first committed block, end-to-end latency).

Shared by the engine-alone runner (``online_engine``) and the HTTP driver (``online_http``), so that
every policy, through the gateway or not, is measured on the same arrivals and reported the same way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine_pod.bench.results import PreparedRequest


@dataclass(frozen=True)
class OnlineRequest:
    request: PreparedRequest
    family: str  # the workload's task, for latencies per family
    prompt: str | None  # the user's message (what a chat client sends), when the workload has one


@dataclass(frozen=True)
class Load:
    """Either an open loop (``rate`` requests per second, Poisson) or a closed loop (``concurrency``
    clients, each sending its next request when the last one ended)."""

    rate: float | None = None
    concurrency: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("a load is either an arrival rate or a concurrency")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"the arrival rate must be positive, got {self.rate}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"the concurrency must be positive, got {self.concurrency}")

    @property
    def label(self) -> str:
        return f"rate {self.rate:g}/s" if self.rate is not None else f"concurrency {self.concurrency}"

    def arrival_offsets(self, count: int) -> list[float]:
        """Seconds after the start at which each request arrives (open loop only)."""
        rng, at, offsets = random.Random(self.seed), 0.0, []
        for _ in range(count):
            offsets.append(at)
            at += rng.expovariate(self.rate)
        return offsets


@dataclass
class Observed:
    """One request as its client saw it (seconds since the run started)."""

    family: str
    sent_s: float
    finished_s: float
    first_block_s: float | None  # when its first committed block arrived (None: none before the end)
    completion_tokens: int
    scheduled_s: float | None = None  # when the engine first ran it (engine-alone runs only)

    @property
    def latency_s(self) -> float:
        return self.finished_s - self.sent_s


def repeat_to(requests: list[OnlineRequest], count: int) -> list[OnlineRequest]:
    """``count`` requests cycling through the workload (ids made unique)."""
    out = []
    for index in range(count):
        item = requests[index % len(requests)]
        prepared = PreparedRequest(
            f"{item.request.request_id}#{index}", item.request.prompt_ids, item.request.max_tokens
        )
        out.append(OnlineRequest(prepared, item.family, item.prompt))
    return out


def online_metrics(observed: list[Observed]) -> dict:
    """Throughput and latency percentiles, overall and per task family."""
    if not observed:
        return {"requests": 0}
    start = min(o.sent_s for o in observed)
    wall = max(o.finished_s for o in observed) - start
    tokens = sum(o.completion_tokens for o in observed)
    families = sorted({o.family for o in observed})
    waits = [o.scheduled_s - o.sent_s for o in observed if o.scheduled_s is not None]
    return {
        "requests": len(observed),
        "wall_s": round(wall, 4),
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "latency_s": _percentiles([o.latency_s for o in observed]),
        "first_block_s": _percentiles(
            [o.first_block_s - o.sent_s for o in observed if o.first_block_s is not None]
        ),
        "queue_wait_s": _percentiles(waits) if waits else None,
        "latency_by_family_s": {
            family: _percentiles([o.latency_s for o in observed if o.family == family]) for family in families
        },
        "first_block_by_family_s": {
            family: _percentiles(
                [
                    o.first_block_s - o.sent_s
                    for o in observed
                    if o.family == family and o.first_block_s is not None
                ]
            )
            for family in families
        },
    }


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)

    mean = round(sum(ordered) / len(ordered), 4)
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(ordered[-1], 4), "mean": mean}
