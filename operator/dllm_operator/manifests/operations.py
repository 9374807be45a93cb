"""What a cluster's operators expect around the engine: a PodDisruptionBudget (a node drain evicts one
engine pod at a time), a metrics Service for the engine pods, and (``monitoring.serviceMonitor``) a
Prometheus Operator ServiceMonitor scraping the engine and the gateway."""

from __future__ import annotations

from typing import Any

from dllm_operator.manifests import common
from dllm_operator.manifests.engine import METRICS_PORT
from dllm_operator.service_spec import ServiceSpec


def engine_disruption_budget(spec: ServiceSpec, owner: dict) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": common.metadata(spec, "engine", owner),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": common.selector_labels(spec, "engine")},
        },
    }


def engine_metrics_service(spec: ServiceSpec, owner: dict) -> dict[str, Any]:
    return common.metrics_service(spec, "engine", owner, METRICS_PORT, common.name_of(spec, "metrics"))


def service_monitor(spec: ServiceSpec, owner: dict) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": common.metadata(spec, "metrics", owner),
        "spec": {
            "selector": {
                "matchLabels": {"app.kubernetes.io/instance": common.instance(spec)},
                "matchExpressions": [{"key": common.METRICS_LABEL, "operator": "Exists"}],
            },
            # the engine's and the gateway's metrics Services both name their port "metrics"
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }
