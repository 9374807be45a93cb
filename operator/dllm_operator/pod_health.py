"""Why a child's pods are not running, in one line: an image that cannot be pulled, a container that
keeps crashing, a Secret or ConfigMap it names that does not exist."""

from __future__ import annotations

from typing import Any

from dllm_operator.k8s import KubeClient

STUCK_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)


def stuck_reason(client: KubeClient, namespace: str, labels: dict[str, str]) -> tuple[str, str] | None:
    """(reason, message) of the first pod with these labels whose container waits for a reason retrying
    will not fix, else None."""
    for pod in client.list("v1", "Pod", namespace, labels):
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []
        ):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_REASONS:
                return waiting["reason"], _message(pod, container, waiting)
    return None


def _message(pod: dict[str, Any], container: dict[str, Any], waiting: dict[str, Any]) -> str:
    detail = (waiting.get("message") or "").splitlines()[0][:300] if waiting.get("message") else ""
    text = f"pod {pod['metadata']['name']} container {container.get('name')}: {waiting['reason']}"
    return f"{text} ({detail})" if detail else text
