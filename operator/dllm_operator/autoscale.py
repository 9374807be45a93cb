"""Queue-depth autoscaling: desired engine replicas, with a scale-down delay."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.keys import ServiceKeys


@dataclass(frozen=True)
class ScaleDecision:
    replicas: int
    below_since: float | None  # when the desired count first dropped below the current one


def desired_replicas(depth: int, target_per_replica: int, minimum: int, maximum: int) -> int:
    return max(minimum, min(maximum, math.ceil(depth / target_per_replica)))


def decide(
    depth: int,
    current: int,
    target: int,
    minimum: int,
    maximum: int,
    delay_s: float,
    below_since: float | None,
    now: float | None = None,
) -> ScaleDecision:
    """Scale up at once; scale down only once the lower count has been wanted for ``delay_s``."""
    now = time.time() if now is None else now
    wanted = desired_replicas(depth, target, minimum, maximum)
    current = max(minimum, min(maximum, current))
    if wanted >= current:
        return ScaleDecision(wanted, None)
    since = below_since if below_since is not None else now
    return ScaleDecision(wanted if now - since >= delay_s else current, since)


def queue_depth(redis_url: str, queue_service: str, password: str | None = None) -> int:
    options = {"password": password} if password else {}
    client = sync_client(redis_url, socket_timeout=2, socket_connect_timeout=2, **options)
    try:
        return int(client.scard(ServiceKeys(queue_service).live))
    finally:
        client.close()
