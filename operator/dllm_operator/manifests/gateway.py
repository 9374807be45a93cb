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
from dllm_operator.service_spec import ServiceSpec
from gateway.settings import ENV_NAMES, GatewaySettings

PORT = 8000
METRICS_PORT = 9091  # /metrics of its own, without the API key: what the ServiceMonitor scrapes
FILES_PATH = "/var/lib/dllm/files"  # the files volume in a gateway pod (spec.gateway.files)
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
        file_store=spec.files_store or FILES_PATH,
        s3_endpoint_url=spec.files_endpoint_url or "",
        storage_quota_bytes=spec.files_quota_bytes,
    )


KEYS_DIR = "/etc/dllm/api-keys"  # the keys Secret's volume: its key's value is the keys file there


def files_volume_claim(spec: ServiceSpec, owner: dict) -> dict[str, Any]:
    """The gateways' files volume (uploads, batch outputs), unless the files live in a bucket."""
    return common.volume_claim(
        spec,
        "gateway",
        owner,
        files_claim_name(spec),
        spec.files_access_mode,
        spec.files_storage,
        spec.files_storage_class,
    )


def files_claim_name(spec: ServiceSpec) -> str:
    return common.name_of(spec, "gateway-files")


def _files_pod(spec: ServiceSpec) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(volumes, mounts, pod fields) for the files: the files volume mounted, and with a ReadWriteOnce
    volume every gateway pod on the node that holds it; nothing for a bucket."""
    if spec.files_store:
        return [], [], {}
    volume = {"name": "files", "persistentVolumeClaim": {"claimName": files_claim_name(spec)}}
    mount = {"name": "files", "mountPath": FILES_PATH}
    pod: dict[str, Any] = {}
    if spec.files_access_mode == "ReadWriteOnce":
        together = {
            "labelSelector": {"matchLabels": common.selector_labels(spec, "gateway")},
            "topologyKey": "kubernetes.io/hostname",
        }
        pod["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [together]}}
    return [volume], [mount], pod


def _env(spec: ServiceSpec, redis_url: str) -> list[dict[str, Any]]:
    # the URL comes with its password from redis_env, the API keys from their Secret's volume
    values = gateway_settings(spec, redis_url).to_env(exclude=("redis_url", "api_keys", "api_keys_file"))
    env = (
        redis_env(spec, redis_url)
        + [{"name": k, "value": v} for k, v in values.items()]
        + common.cache_env(spec)
        + common.tracing_env(spec)
    )
    if spec.api_key:
        env.append({"name": ENV_NAMES["api_keys_file"], "value": f"{KEYS_DIR}/keys"})
    return env


def _keys_volume(spec: ServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The keys Secret as a file (volume, mount): the kubelet updates it in place when the Secret changes,
    and the gateway re-reads it (no restart). Its value is a keys file: keys separated by commas or one a
    line, each line with its limits if any."""
    if not spec.api_key:
        return [], []
    item = {"key": spec.api_key.key, "path": "keys"}
    volume = {"name": "api-keys", "secret": {"secretName": spec.api_key.name, "items": [item]}}
    return [volume], [{"name": "api-keys", "mountPath": KEYS_DIR, "readOnly": True}]


def _env_from(spec: ServiceSpec) -> dict[str, Any]:
    """The bucket's credentials (AWS_* variables) from their Secret, for an s3:// files store."""
    if not (spec.files_store and spec.files_credentials_secret):
        return {}
    return {"envFrom": [{"secretRef": {"name": spec.files_credentials_secret}}]}


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
    key_vols, key_mounts = _keys_volume(spec)
    file_vols, file_mounts, files_pod = _files_pod(spec)
    liveness = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10}  # the process only
    readiness = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5}  # Redis answers too
    container = {
        "name": "gateway",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["python", "-m", "gateway", "--port", str(PORT)],
        "env": _env(spec, redis_url),
        **_env_from(spec),
        # Kubernetes' own sleep action (1.30 and later): no shell or sleep binary needed in the image
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_S}}},
        "ports": [
            {"name": "http", "containerPort": PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "resources": _resources(spec.gateway_processes),
        "volumeMounts": mounts + key_mounts + file_mounts,
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
                    "volumes": vols + key_vols + file_vols,
                    **files_pod,
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
