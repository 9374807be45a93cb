"""A DLLMService's spec read from the resource: ``parse_spec`` gives the typed value
(service_spec.ServiceSpec) with the CRD's defaults applied (the emulator does not default), or a SpecError
for what the CRD schema cannot express."""

from __future__ import annotations

import re
from typing import Any

from dllm_contracts.families import DEFAULT_FAMILY, EXPERT_FAMILIES, FamilyDecoding, family_decoding
from dllm_operator.decoding_options import decoding_option_fields, decoding_option_problems
from dllm_operator.model_spec import source_fields, source_problems
from dllm_operator.parallelism import parse_parallelism
from dllm_operator.scheduling import scheduling_fields, scheduling_problems
from dllm_operator.service_spec import SecretRef, ServiceSpec

LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class SpecError(ValueError):
    """A spec the CRD accepted but this operator cannot run (reported as a Degraded condition)."""


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
        max_prompt_tokens=int(decoding.get("maxPromptTokens", 0)),
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
            "resources.gpus must be 0 or 1 (GPUs per rank; parallelism sets the ranks, replicas the groups)",
        ),
        (
            spec.parallelism.expert > 1 and spec.family not in EXPERT_FAMILIES,
            "parallelism.expert above 1 needs a mixture-of-experts family "
            f"({', '.join(EXPERT_FAMILIES)}): {spec.family} has no experts to spread",
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
