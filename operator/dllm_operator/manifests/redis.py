"""A managed Redis for one service: password from an operator-made Secret, append-only file on a
PersistentVolumeClaim (the queue survives a reschedule), a memory cap that refuses writes rather than
evicting queued requests, a NetworkPolicy that admits only this service's pods, the operator and (KEDA
mode) KEDA's operator, and a PodDisruptionBudget."""

from __future__ import annotations

from typing import Any

from dllm_contracts.queue.connect import REDIS_PASSWORD_ENV
from dllm_operator.config import OperatorSettings
from dllm_operator.manifests import common
from dllm_operator.service_spec import SecretRef, ServiceSpec

PORT = 6379
MEMORY_LIMIT_MIB = 2048
MAXMEMORY_MIB = MEMORY_LIMIT_MIB * 3 // 4  # headroom for the AOF rewrite's fork and client buffers


def managed_redis_url(spec: ServiceSpec) -> str:
    return f"redis://{common.name_of(spec, 'redis')}.{spec.namespace}.svc:{PORT}/0"


AUTH_COMPONENT = "redis-auth"  # the managed Redis's password Secret is <base>-redis-auth


def managed_password_ref(spec: ServiceSpec) -> SecretRef:
    return SecretRef(common.name_of(spec, AUTH_COMPONENT), "password")


def password_ref(spec: ServiceSpec) -> SecretRef | None:
    """The Secret the service's pods take the Redis password from: the managed Redis's own, or the user's."""
    return managed_password_ref(spec) if spec.redis_managed else spec.redis_password


def redis_auth_secret(spec: ServiceSpec, owner: dict, password: str) -> dict[str, Any]:
    """Created once (never patched: the password stays what the running pods were given)."""
    ref = managed_password_ref(spec)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": common.metadata(spec, "redis", owner, name=ref.name),
        "type": "Opaque",
        "stringData": {ref.key: password},
    }


def redis_volume_claim(spec: ServiceSpec, owner: dict) -> dict[str, Any]:
    name = common.name_of(spec, "redis-data")
    return common.volume_claim(
        spec, "redis", owner, name, "ReadWriteOnce", spec.redis_storage, spec.redis_storage_class
    )


def redis_deployment(spec: ServiceSpec, owner: dict, settings: OperatorSettings) -> dict[str, Any]:
    ref = managed_password_ref(spec)
    container = {
        "name": "redis",
        "image": settings.redis_image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": [
            *("--appendonly", "yes", "--appendfsync", "everysec", "--dir", "/data", "--save", ""),
            *("--requirepass", f"$({REDIS_PASSWORD_ENV})"),
            *("--maxmemory", f"{MAXMEMORY_MIB}mb", "--maxmemory-policy", "noeviction"),
        ],
        "env": [common.secret_env(REDIS_PASSWORD_ENV, ref)],
        "ports": [{"name": "redis", "containerPort": PORT}],
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"memory": f"{MEMORY_LIMIT_MIB}Mi"},
        },
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "securityContext": common.container_security(),
    }
    claim = {"claimName": common.name_of(spec, "redis-data")}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": common.metadata(spec, "redis", owner),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # one writer on the volume at a time
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
                    **common.pod_identity(settings),
                    "containers": [container],
                    "volumes": [{"name": "data", "persistentVolumeClaim": claim}],
                },
            },
        },
    }


def redis_service(spec: ServiceSpec, owner: dict) -> dict[str, Any]:
    return common.component_service(
        spec, "redis", owner, [{"name": "redis", "port": PORT, "targetPort": "redis"}]
    )


def _namespace_pods(namespace: str, app_label: dict[str, str]) -> dict[str, Any]:
    """A NetworkPolicy peer: the pods with this label in this namespace."""
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {"matchLabels": app_label},
    }


def redis_network_policy(spec: ServiceSpec, owner: dict, settings: OperatorSettings) -> dict[str, Any]:
    """Ingress to the Redis pod only from this service's pods, from the operator (queue depth) and, in KEDA
    mode, from KEDA's operator (its redis scaler reads the queue depth too)."""
    same_service = {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": common.instance(spec)}}}
    peers: list[dict[str, Any]] = [same_service]
    if settings.operator_namespace:
        operator = {"app.kubernetes.io/name": settings.operator_app}
        peers.append(_namespace_pods(settings.operator_namespace, operator))
    if spec.keda and settings.keda_namespace:
        peers.append(_namespace_pods(settings.keda_namespace, {"app": settings.keda_operator_app}))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": common.metadata(spec, "redis", owner),
        "spec": {
            "podSelector": {"matchLabels": common.selector_labels(spec, "redis")},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": PORT}]}],
        },
    }


def redis_disruption_budget(spec: ServiceSpec, owner: dict, settings: OperatorSettings) -> dict[str, Any]:
    """One Redis pod: ``maxUnavailable`` 1 lets a node drain evict it (it restarts elsewhere with its
    volume, the queue pausing meanwhile), 0 holds every voluntary eviction until someone moves it."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": common.metadata(spec, "redis", owner),
        "spec": {
            "maxUnavailable": settings.redis_max_unavailable,
            "selector": {"matchLabels": common.selector_labels(spec, "redis")},
        },
    }
