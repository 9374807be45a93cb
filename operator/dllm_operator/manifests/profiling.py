"""The profiling Job: `dllm profile` in container mode on the engine's own hardware."""

from __future__ import annotations

from typing import Any

from dllm_operator.config import OperatorSettings
from dllm_operator.decoding_options import profiling_flags
from dllm_operator.manifests import common
from dllm_operator.manifests.model_fetch import fetch_init_containers
from dllm_operator.service_spec import ServiceSpec
from dllm_operator.sparse_cache import importance_volume

TERMINATION_LOG = "/dev/termination-log"


def job_name(spec: ServiceSpec, profile_hash: str) -> str:
    return f"{common.name_of(spec, 'profile')}-{profile_hash[:8]}"


def profiling_job(
    spec: ServiceSpec, owner: dict, settings: OperatorSettings, profile_hash: str
) -> dict[str, Any]:
    vols, mounts = common.engine_volumes(spec)
    importance_vols, importance_mounts = importance_volume(spec.sparse_cache)  # head-centric's, if any
    command = [
        "dllm",
        "profile",
        *common.model_args(spec),
        "--utilization",
        str(spec.utilization),
        "--block-length",
        str(spec.block_length),
        *profiling_flags(spec),  # the logits' and the sparse cache's memory the engines will hold
        *common.tensor_parallel_args(spec),  # the size the engines run at: the budget is per rank of it
        "--json",
        "/tmp/profile.json",
        "--termination-log",
        TERMINATION_LOG,
    ]
    image = spec.image or settings.engine_image
    container = {
        "name": "profile",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "env": common.cache_env(spec) + [common.threads_env()],  # the threads the engine will run
        "resources": common.resources(spec),
        "volumeMounts": mounts + importance_mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",  # a crash before the message: its log tail
        "securityContext": common.container_security(),
    }
    meta = common.metadata(spec, "profile", owner, job_name(spec, profile_hash))
    meta["annotations"] = {"dllm.dev/profile-hash": profile_hash}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 1,
            # unschedulable or hung: Failed, not forever (the pod's whole life: the model's fetch included)
            "activeDeadlineSeconds": spec.profiling_timeout_s,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": common.labels(spec, "profile")},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": common.pod_security(),
                    **common.pod_identity(settings),
                    "initContainers": fetch_init_containers(spec, image, settings.image_pull_policy, mounts),
                    "containers": [container],
                    "volumes": vols + importance_vols,
                    **common.scheduling(spec),
                },
            },
        },
    }
