"""Where a service's token budget stands: from the spec, stored in status, from a finished profiling Job,
or not yet.

A measured profile is a stored fact: once read from the Job's termination message it lives in the
service's status (and the profile ConfigMap), tied to the hash of every field it depends on, and is
never read from the Job again. The Job and its pod may then be deleted (ttlSecondsAfterFinished,
garbage collection, a lost node) without the service noticing."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from dllm_contracts.profile_summary import (
    ProfileFailed,
    ProfileFormatError,
    ProfileSummary,
    read_termination_message,
)
from dllm_operator.config import OperatorSettings
from dllm_operator.decoding_options import profiled_options
from dllm_operator.k8s import KubeClient, collection_path
from dllm_operator.manifests.common import GPU_PRODUCT_LABEL, name_of
from dllm_operator.manifests.profiling import job_name, profiling_job
from dllm_operator.pod_health import stuck_reason
from dllm_operator.service_spec import ServiceSpec


@dataclass(frozen=True)
class ProfileState:
    state: str  # "ready", "running" or "failed"
    profile_hash: str
    summary: ProfileSummary | None = None  # when ready: measured, or the spec's budget
    message: str = ""
    reason: str = ""  # why a running profile is stuck (ImagePullBackOff, ...), else empty


def profile_hash_of(spec: ServiceSpec, engine_image: str) -> str:
    """Fingerprint of every field that changes peak memory: a new value means a new profile."""
    memory_fields = {
        "uri": spec.model_uri,
        "family": spec.family,
        "dtype": spec.dtype,
        "block": spec.block_length,
        "gpus": spec.gpus,
        "gpu_resource": spec.gpu_resource,
        "memory": spec.memory,
        "utilization": spec.utilization,
        "image": spec.image or engine_image,
        "node_selector": spec.node_selector,
    } | ({"revision": spec.revision} if spec.revision else {})  # absent: the hashes of before
    memory_fields |= profiled_options(spec)  # the logit budget, the sparse cache (unset: as before)
    # a budget is per rank of a group of this size (1: the hashes of before)
    if spec.parallelism.tensor > 1:
        memory_fields["tensor_parallel"] = spec.parallelism.tensor
    if spec.parallelism.expert > 1:
        memory_fields["expert_parallel"] = spec.parallelism.expert
    return hashlib.sha256(json.dumps(memory_fields, sort_keys=True).encode()).hexdigest()[:10]


def _termination_message(client: KubeClient, namespace: str, job: str) -> tuple[str | None, str | None]:
    """The newest profiling pod's termination message, and the node it ran on."""
    pods = client.list("v1", "Pod", namespace, {"job-name": job})
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True):
        for status in pod.get("status", {}).get("containerStatuses", []):
            message = status.get("state", {}).get("terminated", {}).get("message")
            if message:
                return message, (pod.get("spec") or {}).get("nodeName")
    return None, None


def _gpu_product(client: KubeClient, node: str | None) -> str | None:
    """The measured node's GPU product label, so engines run on the GPU the budget was measured on."""
    if not node:
        return None
    labels = ((client.get_quietly(f"/api/v1/nodes/{node}") or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(GPU_PRODUCT_LABEL)


def _size_words(tensor: int, expert: int) -> str:
    return f"{tensor}" + (f" with expert-parallel size {expert}" if expert > 1 else "")


def _job_finished(job: dict[str, Any]) -> str | None:
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return condition["type"]
    if status.get("succeeded"):
        return "Complete"
    if status.get("failed", 0) > job.get("spec", {}).get("backoffLimit", 6):
        return "Failed"
    return None


def _at_size(summary: ProfileSummary | None, spec: ServiceSpec) -> ProfileSummary | None:
    """The summary if it was measured at the service's tensor-parallel size: a budget is per rank of a
    group of one size, and never used at another (whatever hash it was stored under)."""
    return summary if summary is not None and _sizes(summary) == _asked(spec) else None


def _sizes(summary: ProfileSummary) -> tuple[int, int]:
    return summary.tensor_parallel, summary.expert_parallel


def _asked(spec: ServiceSpec) -> tuple[int, int]:
    """The sizes a profile must be measured at: the engine's --tensor-parallel and --expert-parallel."""
    return spec.parallelism.tensor, spec.parallelism.expert


def _stored_summary(stored: dict[str, Any], profile_hash: str) -> ProfileSummary | None:
    """The summary in status from an earlier resync, if it belongs to this hash and reads as one."""
    if stored.get("hash") != profile_hash or not stored.get("result"):
        return None
    try:
        return ProfileSummary.parse(stored["result"])
    except ProfileFormatError:
        return None  # not readable (written by hand?): measure again rather than trust it


def _configmap_summary(client: KubeClient, spec: ServiceSpec, profile_hash: str) -> ProfileSummary | None:
    """The summary the profile ConfigMap holds for this hash. A reconcile may work from a view of the
    service older than the status patch that stored its profile (a watch lagging behind on a loaded
    API server): before it looks at the Job (which may be gone, or finished with its pod and termination
    message gone) it asks the other stored copy, read fresh from the API and written before the status."""
    path = f"{collection_path('v1', 'ConfigMap', spec.namespace)}/{name_of(spec, 'profile')}"
    configmap = client.get(path) or {}
    annotations = (configmap.get("metadata") or {}).get("annotations") or {}
    if annotations.get("dllm.dev/profile-hash") != profile_hash:
        return None
    try:
        return ProfileSummary.parse(json.loads((configmap.get("data") or {}).get("profile.json", "")))
    except (ValueError, ProfileFormatError):
        return None


def ensure_profile(
    spec: ServiceSpec,
    owner: dict,
    settings: OperatorSettings,
    client: KubeClient,
    stored: dict[str, Any] | None = None,
) -> ProfileState:
    """``stored``: the service's ``status.profile`` (hash, tokenBudget, result) from earlier resyncs."""
    profile_hash = profile_hash_of(spec, settings.engine_image)
    tensor, expert = _asked(spec)
    if spec.token_budget is not None:
        return ProfileState(
            "ready", profile_hash, ProfileSummary.from_spec(spec.token_budget, tensor, expert)
        )
    summary = _at_size(_stored_summary(stored or {}, profile_hash), spec) or _at_size(
        _configmap_summary(client, spec, profile_hash), spec
    )
    if summary is not None:  # a stored fact: never read from the Job again, whatever became of it
        return ProfileState("ready", profile_hash, summary)
    name = job_name(spec, profile_hash)
    job = client.get(f"{collection_path('batch/v1', 'Job', spec.namespace)}/{name}")
    if job is None:
        # created once, never patched: a Job's pod template cannot change (two reconciles racing here
        # both find no Job; the second create is a conflict, and the first one's Job stands)
        client.create_if_absent(profiling_job(spec, owner, settings, profile_hash))
        return ProfileState("running", profile_hash, message=f"profiling Job {name} created")
    finished = _job_finished(job)
    if finished is None:
        stuck = stuck_reason(client, spec.namespace, {"job-name": name}, settings.unschedulable_after_s)
        if stuck:  # it would wait until its deadline: say why now
            return ProfileState(
                "running", profile_hash, message=f"profiling Job {name}: {stuck[1]}", reason=stuck[0]
            )
        return ProfileState("running", profile_hash, message=f"profiling Job {name} is running")
    message, node = _termination_message(client, spec.namespace, name)
    try:
        summary = read_termination_message(message)
    except (ProfileFailed, ProfileFormatError) as exc:
        return ProfileState("failed", profile_hash, message=str(exc))
    if finished == "Failed":
        return ProfileState("failed", profile_hash, message=f"profiling Job {name} failed")
    if _sizes(summary) != (tensor, expert):  # an engine image that ran the profile at another size
        return ProfileState(
            "failed",
            profile_hash,
            message=f"profiling Job {name} measured a budget at tensor-parallel size "
            f"{_size_words(*_sizes(summary))}, and the service runs at {_size_words(tensor, expert)} (does "
            "the engine image support --tensor-parallel and --expert-parallel?)",
        )
    product = _gpu_product(client, node) if spec.gpus else None
    return ProfileState("ready", profile_hash, summary.with_gpu_product(product))
