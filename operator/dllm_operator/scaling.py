"""The operator's own autoscaler: the engine's size from the queue depth, and the Redis password it may
use to read that depth."""

from __future__ import annotations

import base64
import logging
import time
from typing import Any

from dllm_operator import autoscale
from dllm_operator.conditions import condition, set_condition
from dllm_operator.k8s import KubeClient, collection_path
from dllm_operator.manifests import common
from dllm_operator.manifests.engine_group import engine_kind
from dllm_operator.manifests.redis import password_ref
from dllm_operator.service_spec import ServiceSpec

logger = logging.getLogger(__name__)
SHARE_ANNOTATION = "dllm.dev/share-with-operator"  # on a Secret: its owner lets the operator read it


def autoscale_engine(
    client: KubeClient,
    spec: ServiceSpec,
    redis_url: str,
    status: dict,
    events: list,
    conditions: list,
    generation: int,
) -> tuple[dict[str, Any], list]:
    """Size the engine from the queue depth; an unreadable depth keeps the size and says why."""
    was = (condition(conditions, "Autoscaling") or {}).get("status")
    try:
        depth = autoscale.queue_depth(redis_url, spec.queue_service, redis_password(client, spec))
    except Exception as exc:  # Redis down, not yet up, or refusing us: keep the current size
        message = f"queue depth unavailable, replicas kept: {str(exc).splitlines()[0][:300]}"
        logger.warning("%s: %s", spec.name, message)
        if was != "False":
            events.append(("Warning", "RedisUnreachable", message))
        return {}, set_condition(conditions, "Autoscaling", False, "RedisUnreachable", message, generation)
    conditions = set_condition(
        conditions, "Autoscaling", True, "QueueDepth", f"queue depth {depth}", generation
    )
    current = int(status.get("replicas", spec.min_replicas))
    below = (status.get("autoscaler") or {}).get("belowSince")
    decision = autoscale.decide(
        depth,
        current,
        spec.target_per_replica,
        spec.min_replicas,
        spec.max_replicas,
        spec.scale_down_delay_s,
        below,
    )
    if decision.replicas != current:
        name = common.name_of(spec, "engine")
        client.patch(
            f"{collection_path(*engine_kind(spec), spec.namespace)}/{name}",
            {"spec": {"replicas": decision.replicas}},
        )
        events.append(
            (
                "Normal",
                "Scaled",
                f"engine replicas {current} -> {decision.replicas} (queue depth {depth})",
            )
        )
    scaling = {
        "queueDepth": depth,
        "replicas": decision.replicas,
        "autoscaler": {"belowSince": decision.below_since, "checkedAt": time.time()},
    }
    return scaling, conditions


def redis_password(client: KubeClient, spec: ServiceSpec) -> str | None:
    """The Redis password for the operator's own depth reads, from a Secret its owner shared with the
    operator (annotation SHARE_ANNOTATION: "true"). Without that, anyone allowed to create a
    DLLMService could have the operator send any Secret of the namespace to a Redis URL of their
    choosing; an unshared Secret is never sent (autoscaling then reports RedisUnreachable)."""
    ref = password_ref(spec)  # a managed Redis's own Secret, for the Redis whose URL we built, or the user's
    if ref is None:
        return None
    secret = client.get(f"{collection_path('v1', 'Secret', spec.namespace)}/{ref.name}") or {}
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    if not spec.redis_managed and annotations.get(SHARE_ANNOTATION) != "true":
        raise PermissionError(
            f"Secret {ref.name} is not shared with the operator "
            f"(annotate it {SHARE_ANNOTATION}=true, or use replicas.keda)"
        )
    value = (secret.get("data") or {}).get(ref.key)
    return base64.b64decode(value).decode() if value else None
