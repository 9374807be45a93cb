"""The gateway Deployment (`python -m gateway`, no GPU, no torch) and its Service.

A gateway pod that is told to stop first waits ``PRE_STOP_S`` (serving meanwhile) so that the Service's
endpoints, kube-proxy and ingress controllers stop sending it new connections, then gets SIGTERM and drains
(``drain_timeout_s``, DLLM_DRAIN_TIMEOUT_S) and shuts down; its grace period covers all three."""

from __future__ import annotations

import math
from typing import Any

from dllm_operator.config import OperatorSettings
from dllm_operator.manifests import common
from dllm_operator.manifests.engine import redis_env
from dllm_operator.spec import ServiceSpec
from gateway.settings import ENV_NAMES, GatewaySettings

PORT = 8000
METRICS_PORT = 9091  # /metrics of its own, without the API key: what the ServiceMonitor scrapes
PRE_STOP_S = 5  # before SIGTERM: time for the endpoints to drop the pod (it serves meanwhile)
GRACE_MARGIN_S = 5  # beyond the gateway's own stop time: the kubelet's signalling, a slow node


def gateway_settings(spec: ServiceSpec, redis_url: str) -> GatewaySettings:
    """The service's gateway settings, checked by the gateway's own settings class."""
    return GatewaySettings(
        redis_url=redis_url,
        service=spec.queue_service,
        model_dir="/cache/model",
        model_name=spec.model_name,
        max_prompt_tokens=spec.max_prompt_tokens,
        max_tokens_limit=spec.max_generation_tokens,
        default_max_tokens=min(128, spec.max_generation_tokens),
        block_length=spec.block_length,
        steps_per_block=spec.steps_per_block,
        threshold=spec.threshold,
        max_queued=spec.max_queued,
        metrics_port=METRICS_PORT,
        processes=spec.gateway_processes,
        model_identity=spec.model_identity,
    )


def _env(spec: ServiceSpec, redis_url: str) -> list[dict[str, Any]]:
    # the URL comes with its password from redis_env, the API keys from their Secret
    values = gateway_settings(spec, redis_url).to_env(exclude=("redis_url", "api_keys"))
    env = (
        redis_env(spec, redis_url)
        + [{"name": k, "value": v} for k, v in values.items()]
        + common.cache_env(spec)
    )
    if spec.api_key:
        env.append(common.secret_env(ENV_NAMES["api_keys"], spec.api_key))
    return env


def _tokenizer_init(
    spec: ServiceSpec, image: str, settings: OperatorSettings, mounts: list[dict]
) -> dict[str, Any]:
    """Fetch only the tokenizer files into /cache/model (the gateway never loads weights)."""
    source = common.model_location(spec)
    return {
        "name": "fetch-tokenizer",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["python", "-m", "gateway.fetch_tokenizer", source, "/cache/model"],
        "env": common.cache_env(spec),
        "volumeMounts": mounts,
        "securityContext": common.container_security(),
    }


def _resources(processes: int) -> dict[str, Any]:
    """Half a core and 512 MiB requested per process (a process at saturation uses one core), 2 GiB each
    at most."""
    return {
        "requests": {"cpu": f"{500 * processes}m", "memory": f"{512 * processes}Mi"},
        "limits": {"memory": f"{2 * processes}Gi"},
    }


def termination_grace_s(gateway: GatewaySettings) -> int:
    """The pod's grace period: the preStop wait, then the gateway's drain and shutdown, and a margin."""
    return math.ceil(PRE_STOP_S + gateway.stop_within_s + GRACE_MARGIN_S)


def gateway_deployment(
    spec: ServiceSpec, owner: dict, settings: OperatorSettings, redis_url: str
) -> dict[str, Any]:
    image = spec.gateway_image or settings.gateway_image
    vols, mounts = common.volumes(spec, shared_cache=False)  # tokenizer files only: its own scratch
    liveness = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10}  # the process only
    readiness = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5}  # Redis answers too
    container = {
        "name": "gateway",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["python", "-m", "gateway", "--port", str(PORT)],
        "env": _env(spec, redis_url),
        # Kubernetes' own sleep action (1.30 and later): no shell or sleep binary needed in the image
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_S}}},
        "ports": [
            {"name": "http", "containerPort": PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "resources": _resources(spec.gateway_processes),
        "volumeMounts": mounts,
        "livenessProbe": liveness,
        "readinessProbe": readiness,
        "securityContext": common.container_security(),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": common.metadata(spec, "gateway", owner),
        "spec": {
            "replicas": spec.gateway_replicas,
            "selector": {"matchLabels": common.selector_labels(spec, "gateway")},
            "template": {
                "metadata": {"labels": common.labels(spec, "gateway")},
                "spec": {
                    "terminationGracePeriodSeconds": termination_grace_s(gateway_settings(spec, redis_url)),
                    "securityContext": common.pod_security(),
                    **common.pod_identity(settings),
                    "initContainers": [_tokenizer_init(spec, image, settings, mounts)],
                    "containers": [container],
                    "volumes": vols,
                },
            },
        },
    }


def gateway_service(spec: ServiceSpec, owner: dict) -> dict[str, Any]:
    return common.component_service(
        spec,
        "gateway",
        owner,
        [{"name": "http", "port": spec.gateway_port, "targetPort": "http"}],
        name=common.service_name(spec),
        type=spec.service_type,
    )


def gateway_metrics_service(spec: ServiceSpec, owner: dict) -> dict[str, Any]:
    return common.metrics_service(
        spec, "gateway", owner, METRICS_PORT, common.name_of(spec, "gateway-metrics")
    )
