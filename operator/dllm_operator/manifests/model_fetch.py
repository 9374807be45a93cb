"""The init container that fetches a downloaded model (an s3:// prefix or a Hugging Face repo) into the
cache volume before the engine or the profiler starts: the main container's startup probe then covers
loading only. Init containers take no probes; the fetch bounds itself (``model.downloadTimeoutSeconds``)
and fails in one line, and the kubelet restarts it with back-off (the profiling Job's
activeDeadlineSeconds bounds the whole pod, fetch included)."""

from __future__ import annotations

from typing import Any

from dllm_contracts.model_uri import names_download
from dllm_operator.manifests import common
from dllm_operator.service_spec import ServiceSpec

FETCH_VOLUMES = ("cache", "tmp")  # where it writes: the model cache, and scratch space
FETCH_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}


def fetch_init_containers(
    spec: ServiceSpec, image: str, pull_policy: str, mounts: list[dict]
) -> list[dict[str, Any]]:
    """``[the fetch-model container]`` for a downloaded model, ``[]`` for one on a volume or built in."""
    location = common.model_location(spec)
    if spec.volume_claim or not names_download(location):
        return []
    command = ["python", "-m", "dllm_contracts.fetch_model", location]
    return [
        {
            "name": "fetch-model",
            "image": image,
            "imagePullPolicy": pull_policy,
            "command": [*command, "--deadline", str(spec.download_timeout_s)],
            "env": common.cache_env(spec),
            "resources": FETCH_RESOURCES,
            "volumeMounts": [m for m in mounts if m["name"] in FETCH_VOLUMES],
            "securityContext": common.container_security(),
        }
    ]
