"""Names, labels, owner references and pod-security settings every child manifest shares."""

from __future__ import annotations

from typing import Any

from dllm_contracts.engine_env import THREADS_ENV
from dllm_contracts.model_store_config import MODEL_CACHE_ENV, S3_ENDPOINT_ENV
from dllm_contracts.tracing_config import ENDPOINT_ENV as OTLP_ENDPOINT_ENV
from dllm_operator import names
from dllm_operator.config import GROUP, KIND, VERSION, OperatorSettings
from dllm_operator.service_spec import SecretRef, ServiceSpec

APP = "dllm"
METRICS_LABEL = "dllm.dev/metrics"  # on the Services a ServiceMonitor scrapes
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # a node's GPU, set by NVIDIA GPU feature discovery
S3_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")  # keys of s3CredentialsSecretRef's Secret


def name_of(spec: ServiceSpec, component: str) -> str:
    """A child's name: unique per service and component, a valid RFC 1035 label for any service name."""
    return names.child_name(spec.name, component)


def service_name(spec: ServiceSpec) -> str:
    """The gateway Service (what clients address): the service's own name where it is a valid one."""
    return names.dns_label(spec.name)


def instance(spec: ServiceSpec) -> str:
    """The ``app.kubernetes.io/instance`` label of every child."""
    return names.label_value(spec.name)


def labels(spec: ServiceSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/instance": instance(spec),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "dllm-operator",
    }


def selector_labels(spec: ServiceSpec, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": instance(spec), "app.kubernetes.io/component": component}


def selector_string(spec: ServiceSpec, component: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(spec, component).items())


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": owner["name"],
        "uid": owner["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(
    spec: ServiceSpec, component: str, owner: dict[str, Any], name: str | None = None
) -> dict[str, Any]:
    return {
        "name": name or name_of(spec, component),
        "namespace": spec.namespace,
        "labels": labels(spec, component),
        "ownerReferences": [owner_reference(owner)],
    }


def container_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_identity(settings: OperatorSettings) -> dict[str, Any]:
    """What every pod the operator creates takes from the operator's settings (the chart's values): the
    Secrets its images are pulled with and the ServiceAccount it runs as."""
    identity: dict[str, Any] = {}
    if settings.image_pull_secrets:
        identity["imagePullSecrets"] = [{"name": name} for name in settings.image_pull_secrets]
    if settings.workload_service_account:
        identity["serviceAccountName"] = settings.workload_service_account
    return identity


def model_args(spec: ServiceSpec) -> list[str]:
    """Where a container finds the model (a path on the model volume, or a Hugging Face repo id) and the
    family it must be: the engine refuses a checkpoint of another family in one line."""
    uri = model_location(spec)
    device = "cuda" if spec.gpus else "cpu"
    return ["--model", uri, "--family", spec.family, "--dtype", spec.dtype, "--device", device]


def tensor_parallel_args(spec: ServiceSpec) -> list[str]:
    """``--tensor-parallel N`` and ``--expert-parallel E`` for a group of more than one rank (at 1, the
    engine's default, a flag is left out: engine images that predate it run as before)."""
    return spec.parallelism.engine_args()


def model_location(spec: ServiceSpec) -> str:
    """The model argument containers get: a path on the model volume, builtin:NAME, or a repo id
    (``REPO@REVISION`` when the spec pins a revision)."""
    if spec.volume_claim and not spec.model_uri.startswith("builtin:"):
        return f"/models/{spec.model_uri.lstrip('/')}"
    return f"{spec.model_uri}@{spec.revision}" if spec.revision else spec.model_uri


def volumes(spec: ServiceSpec, shared_cache: bool = True) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts): the model cache (``model.cacheVolumeClaim``, shared by the profiling Job and the
    engine pods, so a checkpoint is downloaded once; else scratch space), /tmp, and the model volume
    when there is one."""
    cache: dict[str, Any] = {"emptyDir": {}}
    if shared_cache and spec.cache_volume_claim:
        cache = {"persistentVolumeClaim": {"claimName": spec.cache_volume_claim}}
    vols = [{"name": "cache", **cache}, {"name": "tmp", "emptyDir": {}}]
    mounts = [{"name": "cache", "mountPath": "/cache"}, {"name": "tmp", "mountPath": "/tmp"}]
    if spec.volume_claim:
        vols.append(
            {"name": "models", "persistentVolumeClaim": {"claimName": spec.volume_claim, "readOnly": True}}
        )
        mounts.append({"name": "models", "mountPath": "/models", "readOnly": True})
    return vols, mounts


def engine_volumes(spec: ServiceSpec) -> tuple[list[dict], list[dict]]:
    """An engine or profiling pod's (volumes, mounts): ``volumes`` and, for a pod of more than one rank, a
    memory-backed /dev/shm for their collectives (the container runtime's default is 64 MiB), sized
    SHM_PER_RANK_GI per rank on the pod. Its pages count towards the pod's memory."""
    vols, mounts = volumes(spec)
    size = spec.parallelism.shm_size()
    if size:
        vols.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    return vols, mounts


def secret_env(variable: str, ref: SecretRef) -> dict[str, Any]:
    """An environment variable taken from a key of a Secret."""
    return {"name": variable, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def component_service(
    spec: ServiceSpec, component: str, owner: dict[str, Any], ports: list[dict[str, Any]], **fields: Any
) -> dict[str, Any]:
    """A Service in front of one component's pods; ``fields``: name, labels (added) or spec fields."""
    meta = metadata(spec, component, owner, name=fields.pop("name", None))
    meta["labels"] |= fields.pop("labels", {})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {**fields, "selector": selector_labels(spec, component), "ports": ports},
    }


def metrics_service(
    spec: ServiceSpec, component: str, owner: dict[str, Any], port: int, name: str
) -> dict[str, Any]:
    """A headless Service (one target per pod) on a component's "metrics" port, labelled for the
    ServiceMonitor; never the Service clients reach."""
    return component_service(
        spec,
        component,
        owner,
        [{"name": "metrics", "port": port, "targetPort": "metrics"}],
        name=name,
        labels={METRICS_LABEL: component},
        clusterIP="None",
    )


def tracing_env(spec: ServiceSpec) -> list[dict[str, Any]]:
    """Where the pod's traces go (OpenTelemetry's variable, read by the gateway and the worker); none set:
    no traces."""
    if not spec.otlp_endpoint:
        return []
    return [{"name": OTLP_ENDPOINT_ENV, "value": spec.otlp_endpoint}]


def cache_env(spec: ServiceSpec) -> list[dict[str, Any]]:
    """Where downloads go, the Hugging Face token (gated or private checkpoints) when one is given, and an
    s3:// model's store and credentials."""
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": "/cache/huggingface"},
        {"name": "XDG_CACHE_HOME", "value": "/cache"},
        {"name": MODEL_CACHE_ENV, "value": "/cache/models"},
    ]
    if spec.hf_token:
        env.append(secret_env("HF_TOKEN", spec.hf_token))
    if spec.s3_endpoint_url:
        env.append({"name": S3_ENDPOINT_ENV, "value": spec.s3_endpoint_url})
    if spec.s3_credentials:
        for variable in S3_CREDENTIAL_KEYS:
            env.append(secret_env(variable, SecretRef(spec.s3_credentials, variable)))
        session = {"name": spec.s3_credentials, "key": "AWS_SESSION_TOKEN", "optional": True}
        env.append({"name": "AWS_SESSION_TOKEN", "valueFrom": {"secretKeyRef": session}})
    return env


def threads_env() -> dict[str, Any]:
    """The engine's torch threads: the container's CPU request, rounded up to whole CPUs (divisor 1).

    The request, not a limit: the operator sets no CPU limit (a limit throttles the engine whenever its
    threads outrun the quota), so no cgroup quota tells the engine its share, and its CPU affinity is the
    whole node; the request is what the scheduler reserved for it. The request is all of it, not one
    fewer as on a shared machine: the pod runs only the engine, whose host work is small and, with no
    limit, may use the node's idle time beyond the request."""
    field = {"resource": "requests.cpu", "divisor": "1"}
    return {"name": THREADS_ENV, "valueFrom": {"resourceFieldRef": field}}


def resources(spec: ServiceSpec) -> dict[str, Any]:
    """An engine or profiling pod's: resources.gpus per rank, times the ranks on the pod."""
    limits: dict[str, Any] = {"memory": spec.memory}
    gpus = spec.parallelism.pod_gpus(spec.gpus)
    if gpus:
        limits[spec.gpu_resource] = str(gpus)
    return {"requests": {"cpu": spec.cpu, "memory": spec.memory}, "limits": limits}


def scheduling(spec: ServiceSpec) -> dict[str, Any]:
    placement: dict[str, Any] = {}
    if spec.node_selector:
        placement["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        placement["tolerations"] = list(spec.tolerations)
    return placement


def volume_claim(
    spec: ServiceSpec,
    component: str,
    owner: dict,
    name: str,
    access_mode: str,
    storage: str,
    storage_class: str | None,
) -> dict[str, Any]:
    """A PersistentVolumeClaim of the service's ``component`` (the StorageClass's default when None)."""
    claim: dict[str, Any] = {"accessModes": [access_mode], "resources": {"requests": {"storage": storage}}}
    if storage_class:
        claim["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(spec, component, owner, name=name),
        "spec": claim,
    }
