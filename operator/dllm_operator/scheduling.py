"""spec.scheduling: which scheduler the engines run and its settings, as `dllm worker` flags.

Defaults and ranges are SchedulerConfig's (dllm_contracts/scheduler_config.py, the one home of both); the
CRD repeats them and a test holds the two equal. ``cacheShare`` and ``prefillChunk`` have no default:
absent, the engines take the profile's measure (``dllm worker --profile``), else 1, and the chunk the
worker derives from its token budget.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from dllm_contracts.scheduler_config import (
    DEFAULTS,
    SERVING_POLICIES,
    SchedulerConfig,
    admission_flags,
    problems_of,
)
from dllm_operator.service_spec import DEFAULT_POLICY, ServiceSpec

SCHEDULING_FIELDS = {
    "admission": "admission",
    "min_padding_efficiency": "minPaddingEfficiency",
    "max_rows": "maxRows",
    "max_wait_s": "maxWaitSeconds",
    "batch_window_s": "batchWindowSeconds",
    "batch_max_wait_s": "batchMaxWaitSeconds",
    "batch_max_rows": "batchMaxRows",
    "refresh_quota": "refreshQuota",
    "batch_refresh_quota": "batchRefreshQuota",
    "refresh_interval": "refreshInterval",
    "cache_share": "cacheShare",
    "step_level": "stepLevel",
    "prefill_chunk": "prefillChunk",
}  # SchedulerConfig's field -> its name under spec.scheduling
UNSET_BY_DEFAULT = ("cache_share", "prefill_chunk")  # absent: the worker's own default
FIELD_TYPES = {"prefill_chunk": int}  # those whose SchedulerConfig default (None) does not give the type


def scheduling_fields(scheduling: dict[str, Any]) -> dict[str, Any]:
    """ServiceSpec's scheduling fields from spec.scheduling, each of SchedulerConfig's type; an absent one
    is SchedulerConfig's default (None for those in UNSET_BY_DEFAULT)."""
    fields: dict[str, Any] = {"policy": scheduling.get("policy", DEFAULT_POLICY)}
    for name, crd_name in SCHEDULING_FIELDS.items():
        default = getattr(DEFAULTS, name)
        if crd_name in scheduling:
            fields[name] = FIELD_TYPES.get(name, type(default))(scheduling[crd_name])
        else:
            fields[name] = None if name in UNSET_BY_DEFAULT else default
    return fields


def _settings(spec: ServiceSpec) -> dict[str, Any]:
    """SchedulerConfig's fields as the spec sets them (those it leaves unset at SchedulerConfig's default)."""
    values = {name: getattr(spec, name) for name in SCHEDULING_FIELDS}
    return asdict(DEFAULTS) | {name: value for name, value in values.items() if value is not None}


def scheduler_settings(spec: ServiceSpec) -> SchedulerConfig:
    """The engines' admission settings (their token budget comes from the profile, not from here)."""
    return SchedulerConfig(**_settings(spec))


def scheduling_problems(spec: ServiceSpec) -> list[str]:
    """What is out of range, each naming its field under spec.scheduling: SchedulerConfig's own checks."""
    problems = []
    if spec.policy not in SERVING_POLICIES:
        problems.append(
            f"scheduling.policy must be one of {', '.join(SERVING_POLICIES)}, got {spec.policy!r}"
        )
    return problems + [
        f"scheduling.{SCHEDULING_FIELDS[name]} {text}"
        for name, text in problems_of(_settings(spec)).items()
        if name in SCHEDULING_FIELDS
    ]


def worker_flags(spec: ServiceSpec) -> list[str]:
    """`dllm worker`'s policy and admission flags; no --cache-share unless the spec sets cacheShare, so
    that the worker takes its profile's."""
    config = scheduler_settings(spec)
    return ["--policy", spec.policy, *admission_flags(config, cache_share=spec.cache_share is not None)]
