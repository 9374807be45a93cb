"""A managed Redis for one service: append-only persistence on an emptyDir, one replica."""

from __future__ import annotations

from typing import Any

from dllm_operator.config import OperatorSettings
from dllm_operator.manifests import common
from dllm_operator.spec import ServiceSpec

PORT = 6379


def managed_redis_url(spec: ServiceSpec) -> str:
    return f"redis://{common.name_of(spec, 'redis')}.{spec.namespace}.svc:{PORT}/0"


def redis_deployment(spec: ServiceSpec, owner: dict, settings: OperatorSettings) -> dict[str, Any]:
    container = {
        "name": "redis",
        "image": settings.redis_image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", "/data", "--save", ""],
        "ports": [{"name": "redis", "containerPort": PORT}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "securityContext": common.container_security(),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": common.metadata(spec, "redis", owner),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": common.selector_labels(spec, "redis")},
            "template": {
                "metadata": {"labels": common.labels(spec, "redis")},
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 999,
                        "fsGroup": 999,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                },
            },
        },
    }


def redis_service(spec: ServiceSpec, owner: dict) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(spec, "redis", owner),
        "spec": {
            "selector": common.selector_labels(spec, "redis"),
            "ports": [{"name": "redis", "port": PORT, "targetPort": "redis"}],
        },
    }
