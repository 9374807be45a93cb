"""A DLLMService's spec as typed values, with the CRD's defaults applied (the emulator does not default)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from dllm_contracts.families import DEFAULT_FAMILY, FAMILY_DECODING, FamilyDecoding, family_decoding
from dllm_contracts.model_identity import FINGERPRINT_CHARS, ModelIdentity
from dllm_contracts.scheduler_config import DEFAULTS
from dllm_operator import names
from dllm_operator.decoding_options import (
    SparseCache,
    decoding_option_fields,
    decoding_option_problems,
    profiled_options,
)
from dllm_operator.model_spec import DEFAULT_DOWNLOAD_TIMEOUT_S, source_fields, source_problems
from dllm_operator.parallelism import Parallelism, parse_parallelism
from dllm_operator.scheduling import DEFAULT_POLICY, scheduling_fields, scheduling_problems

LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class SpecError(ValueError):
    """A spec the CRD accepted but this operator cannot run (reported as a Degraded condition)."""


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    namespace: str
    model_uri: str
    revision: str | None = None  # the Hub revision the checkpoint is pinned to (part of the profile hash)
    family: str = DEFAULT_FAMILY
    dtype: str = "bfloat16"
    served_name: str = ""
    volume_claim: str | None = None
    cache_volume_claim: str | None = None  # PVC for downloads, shared by the profiling Job and the engines
    hf_token: SecretRef | None = None
    s3_credentials: str | None = None  # a Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (s3:// models)
    s3_endpoint_url: str | None = None  # an S3-compatible store's URL (None: AWS S3)
    download_timeout_s: int = DEFAULT_DOWNLOAD_TIMEOUT_S  # the init container that fetches the model
    # parse_spec: the family's defaults (dllm_contracts.families)
    block_length: int = FAMILY_DECODING[DEFAULT_FAMILY].block_length
    steps_per_block: int = FAMILY_DECODING[DEFAULT_FAMILY].steps_per_block
    remasking: str = "threshold"
    threshold: float = 0.9
    cache: str = "dual"
    max_prompt_tokens: int = 2048
    max_generation_tokens: int = 512
    sparse_cache: SparseCache = SparseCache()  # the head-sparse cache (off unless the spec sets a mode)
    max_materialized_logits: int | None = None  # None: the worker's automatic chunk
    logit_candidates: int | None = None  # None: the whole vocabulary
    warm_prefixes: tuple[str, ...] = ()  # dllm worker --warm-prefix, each
    admission: str = DEFAULTS.admission
    min_padding_efficiency: float = DEFAULTS.min_padding_efficiency
    max_rows: int = DEFAULTS.max_rows
    max_wait_s: float = DEFAULTS.max_wait_s
    batch_window_s: float = DEFAULTS.batch_window_s
    batch_max_wait_s: float = DEFAULTS.batch_max_wait_s
    batch_max_rows: int = DEFAULTS.batch_max_rows
    policy: str = DEFAULT_POLICY  # which scheduler the engines run (dllm worker --policy)
    refresh_quota: float = DEFAULTS.refresh_quota
    batch_refresh_quota: float = DEFAULTS.batch_refresh_quota
    refresh_interval: int = DEFAULTS.refresh_interval
    cache_share: float | None = None  # None: the profile's measure, else SchedulerConfig's default
    step_level: bool = DEFAULTS.step_level
    image: str | None = None
    gpus: int = 1  # per rank: a pod requests parallelism.pod_gpus(gpus)
    gpu_resource: str = "nvidia.com/gpu"
    memory: str = "64Gi"
    cpu: str = "8"
    node_selector: dict[str, str] = field(default_factory=dict)
    pin_gpu_product: bool = True  # engines run on the GPU product the profile measured
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    parallelism: Parallelism = Parallelism()  # ranks per engine group, and the nodes they spread over
    profiling_enabled: bool = True
    utilization: float = 0.9
    profiling_timeout_s: int = 3600
    token_budget: int | None = None
    min_replicas: int = 1
    max_replicas: int = 1
    target_per_replica: int = 32
    scale_down_delay_s: int = 300
    keda: bool = False
    redis_managed: bool = True
    redis_url: str | None = None
    redis_password: SecretRef | None = None
    redis_storage: str = "8Gi"  # managed Redis: its append-only file's volume
    redis_storage_class: str | None = None
    gateway_replicas: int = 1
    gateway_processes: int = 1  # per pod, sharing its port
    gateway_image: str | None = None
    service_type: str = "ClusterIP"
    gateway_port: int = 80
    max_queued: int = 10_000
    api_key: SecretRef | None = None
    files_store: str | None = None  # s3://BUCKET/PREFIX; None: a volume of the gateways' (files_*)
    files_endpoint_url: str | None = None  # the S3-compatible server of files_store
    files_credentials_secret: str | None = None  # a Secret of AWS_* variables for files_store
    files_storage: str = "10Gi"  # the files volume's size
    files_storage_class: str | None = None
    files_access_mode: str = "ReadWriteOnce"  # ReadWriteMany lets the gateway pods spread over nodes
    files_quota_bytes: int = 0  # per tenant (0: none)
    service_monitor: bool = False  # emit a Prometheus Operator ServiceMonitor for engine and gateway
    otlp_endpoint: str | None = None  # where gateway and engine pods send traces (OTLP/HTTP); None: none

    @property
    def queue_service(self) -> str:
        """Redis key prefix of this service's queue (unique across namespaces on a shared Redis)."""
        return names.dns_label(f"{self.namespace}-{self.name}")

    @property
    def model_name(self) -> str:
        return self.served_name or self.model_uri.rstrip("/").split("/")[-1]

    @property
    def model_identity(self) -> str:
        """What its gateways stamp requests with and its engines check (``dllm_contracts.model_identity``):
        the served name and a digest of what picks the weights and how they compute (uri, revision,
        family, dtype). A change of any rolls pods that refuse the requests accepted before it."""
        weights = {
            "uri": self.model_uri,
            "revision": self.revision,
            "family": self.family,
            "dtype": self.dtype,
        }
        digest = hashlib.sha256(json.dumps(weights, sort_keys=True).encode()).hexdigest()
        return ModelIdentity(self.model_name, digest[:FINGERPRINT_CHARS]).text

    def profile_hash(self, engine_image: str) -> str:
        """Fingerprint of every field that changes peak memory: a new value means a new profile."""
        memory_fields = {
            "uri": self.model_uri,
            "family": self.family,
            "dtype": self.dtype,
            "block": self.block_length,
            "gpus": self.gpus,
            "gpu_resource": self.gpu_resource,
            "memory": self.memory,
            "utilization": self.utilization,
            "image": self.image or engine_image,
            "node_selector": self.node_selector,
        } | ({"revision": self.revision} if self.revision else {})  # absent: the hashes of before
        memory_fields |= profiled_options(self)  # the logit budget, the sparse cache (unset: as before)
        if (
            self.parallelism.tensor > 1
        ):  # a budget is per rank of a group of this size (1: the hashes of before)
            memory_fields["tensor_parallel"] = self.parallelism.tensor
        return hashlib.sha256(json.dumps(memory_fields, sort_keys=True).encode()).hexdigest()[:10]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _files(files: dict[str, Any]) -> dict[str, Any]:
    """spec.gateway.files: where the gateways keep uploaded files and batch outputs."""
    return {
        "files_store": files.get("store"),
        "files_endpoint_url": files.get("endpointUrl"),
        "files_credentials_secret": files.get("credentialsSecretName"),
        "files_storage": str(files.get("storage", "10Gi")),
        "files_storage_class": files.get("storageClassName"),
        "files_access_mode": files.get("accessMode", "ReadWriteOnce"),
        "files_quota_bytes": int(files.get("quotaBytes", 0)),
    }


def _ref(value: dict | None) -> SecretRef | None:
    return SecretRef(value["name"], value["key"]) if value else None


def _family(model: dict[str, Any]) -> tuple[str, FamilyDecoding]:
    """The model's family and the decoding it starts from (what decoding leaves unset)."""
    family = model.get("family", DEFAULT_FAMILY)
    try:
        return family, family_decoding(family)
    except ValueError as exc:
        raise SpecError(f"spec.model.family: {exc}") from None


def parse_spec(name: str, namespace: str, spec: dict[str, Any]) -> ServiceSpec:
    """Typed spec with defaults; SpecError for what the CRD schema cannot express."""
    model = spec.get("model") or {}
    if not model.get("uri"):
        raise SpecError("spec.model.uri is required")
    decoding, resources = spec.get("decoding") or {}, spec.get("resources") or {}
    profiling, replicas = spec.get("profiling") or {}, spec.get("replicas") or {}
    redis, gateway = spec.get("redis") or {"managed": True}, spec.get("gateway") or {}
    budget = profiling.get("tokenBudget")
    family, decoded = _family(model)
    for failed, message in source_problems(model):
        if failed:
            raise SpecError(message)
    parsed = ServiceSpec(
        name=name,
        namespace=namespace,
        **source_fields(model),
        revision=model.get("revision"),
        family=family,
        dtype=model.get("dtype", "bfloat16"),
        served_name=model.get("servedName", ""),
        cache_volume_claim=model.get("cacheVolumeClaim"),
        hf_token=_ref(model.get("hfTokenSecretRef")),
        block_length=int(decoding.get("blockLength", decoded.block_length)),
        steps_per_block=int(decoding.get("stepsPerBlock", decoded.steps_per_block)),
        remasking=decoding.get("remasking", "threshold"),
        threshold=float(decoding.get("threshold", 0.9)),
        cache=decoding.get("cache", "dual"),
        max_prompt_tokens=int(decoding.get("maxPromptTokens", 2048)),
        max_generation_tokens=int(decoding.get("maxGenerationTokens", 512)),
        **decoding_option_fields(decoding),
        **scheduling_fields(spec.get("scheduling") or {}),
        image=resources.get("image"),
        gpus=int(resources.get("gpus", 1)),
        gpu_resource=resources.get("gpuResourceName", "nvidia.com/gpu"),
        memory=str(resources.get("memory", "64Gi")),
        cpu=str(resources.get("cpu", "8")),
        node_selector=dict(resources.get("nodeSelector") or {}),
        pin_gpu_product=bool(resources.get("pinGpuProduct", True)),
        tolerations=list(resources.get("tolerations") or []),
        parallelism=parse_parallelism(spec.get("parallelism")),
        profiling_enabled=bool(profiling.get("enabled", budget is None)),
        utilization=float(profiling.get("utilization", 0.9)),
        profiling_timeout_s=int(profiling.get("timeoutSeconds", 3600)),
        token_budget=int(budget) if budget is not None else None,
        min_replicas=int(replicas.get("min", 1)),
        max_replicas=int(replicas.get("max", 1)),
        target_per_replica=int(replicas.get("targetQueueDepthPerReplica", 32)),
        scale_down_delay_s=int(replicas.get("scaleDownDelaySeconds", 300)),
        keda=bool(replicas.get("keda", False)),
        redis_managed=bool(redis.get("managed", False)),
        redis_url=redis.get("url"),
        redis_password=_ref(redis.get("passwordSecretRef")),
        redis_storage=str(redis.get("storage", "8Gi")),
        redis_storage_class=redis.get("storageClassName"),
        gateway_replicas=int(gateway.get("replicas", 1)),
        gateway_processes=int(gateway.get("processes", 1)),
        gateway_image=gateway.get("image"),
        service_type=gateway.get("serviceType", "ClusterIP"),
        gateway_port=int(gateway.get("port", 80)),
        max_queued=int(gateway.get("maxQueued", 10_000)),
        api_key=_ref(gateway.get("apiKeySecretRef")),
        **_files(gateway.get("files") or {}),
        service_monitor=bool((spec.get("monitoring") or {}).get("serviceMonitor", False)),
        otlp_endpoint=(spec.get("monitoring") or {}).get("otlpEndpoint") or None,
    )
    _check(parsed)
    return parsed


def _check(spec: ServiceSpec) -> None:
    """The CRD's CEL rules again: the operator must not trust that admission ran them."""
    problems = [
        (spec.min_replicas > spec.max_replicas, "replicas.min must not exceed replicas.max"),
        (
            spec.profiling_enabled and spec.token_budget is not None,
            "set either profiling.enabled or profiling.tokenBudget",
        ),
        (
            not spec.profiling_enabled and spec.token_budget is None,
            "with profiling disabled, profiling.tokenBudget is required",
        ),
        (
            spec.max_generation_tokens % spec.block_length != 0,
            "decoding.blockLength must divide decoding.maxGenerationTokens "
            f"({spec.family}: {spec.block_length} and {spec.max_generation_tokens})",
        ),
        (spec.redis_managed == bool(spec.redis_url), "use either a managed Redis or redis.url, exactly one"),
        (
            "@" in (spec.redis_url or ""),
            "redis.url must not carry credentials: put the password in redis.passwordSecretRef",
        ),
        (
            spec.redis_managed and spec.redis_password is not None,
            "a managed Redis makes its own password: redis.passwordSecretRef is for redis.url",
        ),
        (
            not 0 <= spec.gpus <= 1,
            "resources.gpus must be 0 or 1 (GPUs per rank; parallelism.tensor sets the ranks, replicas the "
            "groups)",
        ),
        (
            spec.parallelism.multi_node and spec.token_budget is None,
            "parallelism.nodes above 1 needs profiling.tokenBudget (a profile runs in one pod)",
        ),
        (
            spec.steps_per_block > spec.block_length,
            "decoding.stepsPerBlock must not exceed decoding.blockLength "
            f"({spec.family}: {spec.steps_per_block} and {spec.block_length})",
        ),
    ]
    problems += [(True, text) for text in scheduling_problems(spec)]
    problems += [(True, text) for text in decoding_option_problems(spec)]
    problems += [(True, text) for text in spec.parallelism.problems()]
    problems += [  # the CRD cannot afford this check (a regular expression over map keys is over its budget)
        (True, f"resources.nodeSelector key {key!r} is not a label key (optional-prefix/name)")
        for key in spec.node_selector
        if not LABEL_KEY.match(key) or len(key) > 316
    ]
    for failed, message in problems:
        if failed:
            raise SpecError(message)
