"""A DLLMService's spec as one typed value, with the CRD's defaults applied (the emulator does not default):
what every part of the operator reads. ``spec.parse_spec`` makes it from the resource."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from dllm_contracts.families import DEFAULT_FAMILY, FAMILY_DECODING
from dllm_contracts.model_identity import FINGERPRINT_CHARS, ModelIdentity
from dllm_contracts.scheduler_config import DEFAULTS, SERVING_POLICIES
from dllm_operator import names
from dllm_operator.model_spec import DEFAULT_DOWNLOAD_TIMEOUT_S
from dllm_operator.parallelism import Parallelism
from dllm_operator.sparse_cache import SparseCache

DEFAULT_POLICY = SERVING_POLICIES[0]  # the scheduler the engines run when spec.scheduling.policy is unset


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
    max_prompt_tokens: int = 0  # 0: the model's context less each request's max_tokens (the gateway's)
    max_generation_tokens: int = 512
    sparse_cache: SparseCache = SparseCache()  # the head-sparse cache (off unless the spec sets a mode)
    max_materialized_logits: int | None = None  # None: the worker's automatic chunk
    logit_candidates: int | None = None  # None: the whole vocabulary
    warm_prefixes: tuple[str, ...] = ()  # dllm worker --warm-prefix, each
    batch_invariant: bool = False  # dllm worker --batch-invariant
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
    prefill_chunk: int | None = None  # None: the worker's default (512, or an eighth of its budget)
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
