"""The engine's pods (`dllm worker`, sized by the profiled token budget) and the Deployment that runs them, one
engine group per pod; manifests/engine_group.py picks the workload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dllm_contracts.queue.connect import REDIS_PASSWORD_ENV
from dllm_operator.config import OperatorSettings
from dllm_operator.decoding_options import decoding_option_flags
from dllm_operator.manifests import common
from dllm_operator.manifests.model_fetch import fetch_init_containers
from dllm_operator.manifests.redis import password_ref
from dllm_operator.scheduling import worker_flags
from dllm_operator.service_spec import ServiceSpec
from dllm_operator.sparse_cache import importance_volume

PROFILE_MOUNT = "/etc/dllm/profile"
METRICS_PORT = 9090
# how long the engine may take to load its model (from the cache or the model volume into memory): a
# downloaded model is fetched before, by the fetch-model init container, under its own deadline
STARTUP_BUDGET_S = 1200
DRAIN_S = 60  # after SIGTERM: the worker finishes its rows (--drain-timeout), then hands the rest back
GRACE_MARGIN_S = 30  # beyond the drain: handing unfinished work back to the queue, exiting


@dataclass(frozen=True)
class EnginePods:
    """What an engine's pods are made from besides the spec, whatever workload runs them."""

    settings: OperatorSettings
    redis_url: str  # the queue's Redis
    profile_hash: str  # the profile they run on (its ConfigMap is mounted)
    gpu_product: str | None = None  # the GPU the budget was measured on (see _placement)


def profile_configmap(spec: ServiceSpec, owner: dict, profile_json: str, profile_hash: str) -> dict[str, Any]:
    meta = common.metadata(spec, "profile", owner)
    meta["annotations"] = {"dllm.dev/profile-hash": profile_hash}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"profile.json": profile_json}}


def redis_env(spec: ServiceSpec, redis_url: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "DLLM_REDIS_URL", "value": redis_url}]
    secret = password_ref(spec)
    if secret:
        env.append(common.secret_env(REDIS_PASSWORD_ENV, secret))
    return env


def _probe(path: str, delay: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "initialDelaySeconds": delay,
        "periodSeconds": 10,
        "failureThreshold": 6,
    }


def worker_command(spec: ServiceSpec) -> list[str]:
    """`dllm worker` as every engine pod runs it (a multi-node group's pods add their place in the group)."""
    return [
        "dllm",
        "worker",
        *common.model_args(spec),
        "--redis",
        "$(DLLM_REDIS_URL)",
        "--service",
        spec.queue_service,
        "--profile",
        f"{PROFILE_MOUNT}/profile.json",
        "--block-length",
        str(spec.block_length),
        "--steps-per-block",
        str(spec.steps_per_block),
        "--remasking",
        spec.remasking,
        "--threshold",
        str(spec.threshold),
        "--cache",
        spec.cache,
        *worker_flags(spec),
        *decoding_option_flags(spec),
        *common.tensor_parallel_args(spec),
        "--port",
        str(METRICS_PORT),
        "--drain-timeout",
        str(DRAIN_S),
        "--model-identity",
        spec.model_identity,
    ]


def engine_pod_spec(
    spec: ServiceSpec,
    pods: EnginePods,
    command: list[str],
    leads: bool = True,
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An engine pod: ``command`` in the engine container. ``leads``: it claims work and serves (a
    Deployment's pods, a group's node 0), so it is probed; a follower of a multi-node group is not (its
    group is restarted as one when any of its pods fails)."""
    vols, mounts = common.engine_volumes(spec)
    vols.append({"name": "profile", "configMap": {"name": common.name_of(spec, "profile")}})
    mounts.append({"name": "profile", "mountPath": PROFILE_MOUNT, "readOnly": True})
    importance_vols, importance_mounts = importance_volume(spec.sparse_cache)
    vols, mounts = vols + importance_vols, mounts + importance_mounts
    settings = pods.settings
    image = spec.image or settings.engine_image
    container = {
        "name": "engine",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "env": redis_env(spec, pods.redis_url)
        + common.cache_env(spec)
        + [common.threads_env()]
        + common.tracing_env(spec),
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}, *(ports or [])],
        "resources": common.resources(spec),
        "volumeMounts": mounts,
    }
    if leads:
        container |= {
            # the probe server answers from the start; startup waits for the model to load (its download
            # was the init container's) up to STARTUP_BUDGET_S, and only then does liveness count
            "startupProbe": {
                "httpGet": {"path": "/startupz", "port": "metrics"},
                "periodSeconds": 10,
                "failureThreshold": STARTUP_BUDGET_S // 10,
            },
            "livenessProbe": _probe("/healthz", 0),
            "readinessProbe": _probe("/readyz", 0),
        }
    container["securityContext"] = common.container_security()
    return {
        "terminationGracePeriodSeconds": DRAIN_S + GRACE_MARGIN_S,
        "securityContext": common.pod_security(),
        **common.pod_identity(settings),
        "initContainers": fetch_init_containers(spec, image, settings.image_pull_policy, mounts),
        "containers": [container],
        "volumes": vols,
        **_placement(spec, pods.gpu_product),
    }


def engine_template_metadata(spec: ServiceSpec, profile_hash: str) -> dict[str, Any]:
    return {
        "labels": common.labels(spec, "engine"),
        "annotations": {
            "dllm.dev/profile-hash": profile_hash,
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(METRICS_PORT),
        },
    }


def deployment_spec(spec: ServiceSpec, pods: EnginePods) -> dict[str, Any]:
    """The engine Deployment's spec but its replicas: one engine group per pod (parallelism.nodes 1). The
    pods are pinned to the GPU the budget was measured on unless the spec says otherwise
    (resources.pinGpuProduct: false, or its own nodeSelector for that label)."""
    pod = engine_pod_spec(spec, pods, worker_command(spec))
    return {
        # a GPU pod cannot surge onto a full node: replace one pod at a time instead
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
        if spec.gpus
        else {"type": "RollingUpdate"},
        "selector": {"matchLabels": common.selector_labels(spec, "engine")},
        "template": {"metadata": engine_template_metadata(spec, pods.profile_hash), "spec": pod},
    }


def _placement(spec: ServiceSpec, gpu_product: str | None) -> dict[str, Any]:
    placement = common.scheduling(spec)
    if gpu_product and spec.pin_gpu_product and common.GPU_PRODUCT_LABEL not in spec.node_selector:
        placement["nodeSelector"] = placement.get("nodeSelector", {}) | {
            common.GPU_PRODUCT_LABEL: gpu_product
        }
    return placement
