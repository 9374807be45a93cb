"""Why a child's pods are not running, in one line: an image that cannot be pulled, a container that
keeps crashing, a Secret or ConfigMap it names that does not exist, or a pod the scheduler has found no
node for (Unschedulable) for longer than a bound."""

from __future__ import annotations

import datetime
from typing import Any

from dllm_operator.k8s import KubeClient

UNSCHEDULABLE = "Unschedulable"  # the scheduler's reason on PodScheduled when no node fits the pod

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


def stuck_reason(
    client: KubeClient, namespace: str, labels: dict[str, str], unschedulable_after_s: float | None = None
) -> tuple[str, str] | None:
    """(reason, message) of the first pod with these labels whose container waits for a reason retrying
    will not fix, or that no node could take for ``unschedulable_after_s`` (None: not judged), else None."""
    for pod in client.list("v1", "Pod", namespace, labels):
        status = pod.get("status") or {}
        if unschedulable_after_s is not None:
            unplaced = _unschedulable(pod, unschedulable_after_s)
            if unplaced:
                return UNSCHEDULABLE, unplaced
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


def _unschedulable(pod: dict[str, Any], after_s: float) -> str | None:
    """Why the pod has waited for a node for ``after_s`` or longer (the scheduler's message), else None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status")) != ("PodScheduled", "False"):
            continue
        since = _time(condition.get("lastTransitionTime"))
        if condition.get("reason") != UNSCHEDULABLE or since is None:
            return None
        waited = (datetime.datetime.now(datetime.timezone.utc) - since).total_seconds()
        if waited < after_s:
            return None
        detail = (condition.get("message") or "").strip().splitlines()
        text = f"pod {pod['metadata']['name']} has found no node for {waited:.0f} s"
        return f"{text} ({detail[0][:300]})" if detail else text
    return None


def _time(text: str | None) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(text or "", "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc
        )
    except ValueError:
        return None
