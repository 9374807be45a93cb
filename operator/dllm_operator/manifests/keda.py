"""A KEDA ScaledObject scaling the engine Deployment on queue depth: one trigger on the service's live set
(pending + in flight, the number the operator's own autoscaler uses; KEDA's redis scaler counts a set
with SCARD), scale-down held for ``scaleDownDelaySeconds`` by the HPA's stabilization window; a
``redis+cluster://`` URL gets KEDA's redis-cluster scaler."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from dllm_contracts.queue.connect import REDIS_PASSWORD_ENV, is_cluster_url
from dllm_contracts.queue.keys import ServiceKeys
from dllm_operator.manifests import common
from dllm_operator.manifests.engine_group import engine_kind
from dllm_operator.manifests.redis import password_ref
from dllm_operator.service_spec import ServiceSpec


def _trigger(spec: ServiceSpec, redis_url: str, key: str) -> dict[str, Any]:
    parsed = urlparse(redis_url)
    address = f"{parsed.hostname}:{parsed.port or 6379}"
    metadata = {"listName": key, "listLength": str(spec.target_per_replica)}
    if is_cluster_url(redis_url):
        trigger: dict[str, Any] = {"type": "redis-cluster", "metadata": {"addresses": address, **metadata}}
    else:
        database = (parsed.path or "/0").lstrip("/") or "0"
        trigger = {"type": "redis", "metadata": {"address": address, **metadata, "databaseIndex": database}}
    if parsed.scheme.startswith("rediss"):
        trigger["metadata"]["enableTLS"] = "true"
    if password_ref(spec):
        trigger["metadata"]["passwordFromEnv"] = REDIS_PASSWORD_ENV
    return trigger


def _target(spec: ServiceSpec) -> dict[str, Any]:
    """The engine: a Deployment (KEDA's default kind) or a LeaderWorkerSet (through its scale subresource,
    whose replicas are whole groups)."""
    api_version, kind = engine_kind(spec)
    target = {"name": common.name_of(spec, "engine")}
    return target if kind == "Deployment" else {"apiVersion": api_version, "kind": kind} | target


def scaled_object(spec: ServiceSpec, owner: dict, redis_url: str) -> dict[str, Any]:
    keys = ServiceKeys(spec.queue_service)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": common.metadata(spec, "engine", owner),
        "spec": {
            "scaleTargetRef": _target(spec),
            "minReplicaCount": spec.min_replicas,
            "maxReplicaCount": spec.max_replicas,
            "cooldownPeriod": spec.scale_down_delay_s,  # KEDA's own: only for scaling to zero
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": spec.scale_down_delay_s}}
                }
            },
            "triggers": [_trigger(spec, redis_url, keys.live)],
        },
    }
