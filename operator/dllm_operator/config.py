"""Operator settings: images, intervals and what every pod it creates runs with, read from the
environment only here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from dllm_contracts.families import FAMILIES

# the variables the chart sets (templates/deployment.yaml) for the pods the operator creates
IMAGE_PULL_SECRETS_ENV = "DLLM_IMAGE_PULL_SECRETS"  # Secret names, comma-separated
WORKLOAD_SERVICE_ACCOUNT_ENV = "DLLM_WORKLOAD_SERVICE_ACCOUNT"


def _names(env: Mapping[str, str], variable: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated list of names (blanks dropped)."""
    value = env.get(variable)
    if value is None:
        return default
    return tuple(name.strip() for name in value.split(",") if name.strip())


def _max_unavailable(value: str | None) -> int:
    if value is None or value.strip() == "":
        return OperatorSettings.redis_max_unavailable
    if value.strip() not in ("0", "1"):
        raise ValueError(f"DLLM_REDIS_MAX_UNAVAILABLE must be 0 or 1, not {value!r}")
    return int(value)


@dataclass(frozen=True)
class OperatorSettings:
    engine_image: str = "ghcr.io/dllm-dev/dllm-engine:0.1.0"
    gateway_image: str = "ghcr.io/dllm-dev/dllm-gateway:0.1.0"
    redis_image: str = "redis:7.2-alpine"
    supported_families: tuple[str, ...] = FAMILIES  # the engine image's (the chart sets them)
    resync_seconds: float = 15.0  # timer period: progress checks and autoscaling
    api_url: str | None = (
        None  # talk to this API server (tests: the kmock emulator); else in-cluster/kubeconfig
    )
    image_pull_policy: str = "IfNotPresent"
    # every pod the operator creates (engine, gateway, profiling Job, managed Redis) pulls its image with
    # these Secrets and runs as this ServiceAccount ("": its namespace's default); both must exist in the
    # DLLMService's namespace
    image_pull_secrets: tuple[str, ...] = ()
    workload_service_account: str = ""
    operator_namespace: str = ""  # where the operator runs (managed Redis admits its pods)
    operator_app: str = "dllm-operator"  # the operator pods' app.kubernetes.io/name
    # KEDA mode: KEDA's operator reads the queue depth from the managed Redis, whose NetworkPolicy admits
    # the pods labelled app=<keda_operator_app> in the namespace keda_namespace ("": none admitted). The
    # label is the one KEDA's Helm chart and its release manifests both put on the operator's pods (their
    # Deployments select on it); only keda-operator talks to scalers (the metrics server asks it over gRPC)
    keda_namespace: str = "keda"
    keda_operator_app: str = "keda-operator"
    # the managed Redis's PodDisruptionBudget: 1 lets a node drain evict its one pod (the queue pauses while
    # it restarts elsewhere, nothing accepted is lost), 0 blocks every voluntary eviction (a drain waits until
    # someone moves it)
    redis_max_unavailable: int = 1
    # a pod the scheduler has found no node for (Unschedulable) this long is said in the service's
    # conditions (a group larger than any node, GPUs all taken): long enough for a cluster autoscaler
    unschedulable_after_s: float = 300.0

    @classmethod
    def from_env(cls) -> OperatorSettings:
        env = os.environ
        return cls(
            engine_image=env.get("DLLM_ENGINE_IMAGE", cls.engine_image),
            gateway_image=env.get("DLLM_GATEWAY_IMAGE", cls.gateway_image),
            redis_image=env.get("DLLM_REDIS_IMAGE", cls.redis_image),
            supported_families=_names(env, "DLLM_SUPPORTED_FAMILIES", cls.supported_families),
            resync_seconds=float(env.get("DLLM_OPERATOR_RESYNC_S", cls.resync_seconds)),
            api_url=env.get("DLLM_K8S_API_URL") or None,
            image_pull_policy=env.get("DLLM_IMAGE_PULL_POLICY", cls.image_pull_policy),
            image_pull_secrets=_names(env, IMAGE_PULL_SECRETS_ENV, cls.image_pull_secrets),
            workload_service_account=env.get(WORKLOAD_SERVICE_ACCOUNT_ENV, cls.workload_service_account),
            operator_namespace=env.get("DLLM_OPERATOR_NAMESPACE", cls.operator_namespace),
            operator_app=env.get("DLLM_OPERATOR_APP", cls.operator_app),
            keda_namespace=env.get("DLLM_KEDA_NAMESPACE", cls.keda_namespace),
            keda_operator_app=env.get("DLLM_KEDA_OPERATOR_APP", cls.keda_operator_app),
            redis_max_unavailable=_max_unavailable(env.get("DLLM_REDIS_MAX_UNAVAILABLE")),
            unschedulable_after_s=float(env.get("DLLM_UNSCHEDULABLE_AFTER_S", cls.unschedulable_after_s)),
        )


GROUP, VERSION, PLURAL, KIND = "dllm.dev", "v1alpha1", "dllmservices", "DLLMService"
