"""The engine's workload: a Deployment (manifests/engine.py) or, for multi-node groups (parallelism.nodes
above 1), a LeaderWorkerSet whose every replica is one engine group of ``nodes`` pods. Node 0 (LWS's leader) claims work and serves; nodes 1 to nodes - 1 (its
workers) follow it. The LeaderWorkerSet controller sets LWS_LEADER_ADDRESS (the leader pod's DNS name) and
LWS_WORKER_INDEX (the pod's place in its group, 0 for the leader) in every container, and the kubelet
expands them in the command."""

from __future__ import annotations

from typing import Any

from dllm_operator.manifests import common
from dllm_operator.manifests.engine import (
    EnginePods,
    deployment_spec,
    engine_pod_spec,
    engine_template_metadata,
    worker_command,
)
from dllm_operator.parallelism import GROUP_PORT
from dllm_operator.service_spec import ServiceSpec

API_VERSION, KIND = "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"  # set by the LeaderWorkerSet controller in every container
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
ROLE_LABEL = "dllm.dev/group-role"  # leader or follower: which pods of a group claim work and serve


def group_args(spec: ServiceSpec, node_rank: str) -> list[str]:
    """A group pod's place in its group: the nodes, this pod's rank among them, node 0's address."""
    return [
        "--nodes",
        str(spec.parallelism.nodes),
        "--node-rank",
        node_rank,
        "--group-address",
        f"$({LEADER_ADDRESS_ENV}):{GROUP_PORT}",
    ]


def _template(spec: ServiceSpec, pods: EnginePods, leads: bool) -> dict[str, Any]:
    rank = "0" if leads else f"$({WORKER_INDEX_ENV})"
    command = worker_command(spec) + group_args(spec, rank)
    ports = [{"name": "group", "containerPort": GROUP_PORT}] if leads else None
    metadata = engine_template_metadata(spec, pods.profile_hash)
    metadata["labels"] |= {ROLE_LABEL: "leader" if leads else "follower"}
    pod = engine_pod_spec(spec, pods, command, leads=leads, ports=ports)
    return {"metadata": metadata, "spec": pod}


def group_set_spec(spec: ServiceSpec, pods: EnginePods) -> dict[str, Any]:
    """The LeaderWorkerSet's spec but its replicas: engine groups of parallelism.nodes pods, each pod
    parallelism.tensor / nodes ranks."""
    return {
        "startupPolicy": "LeaderCreated",
        # whole groups are replaced one at a time, without a spare group's GPUs
        "rolloutStrategy": {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
        },
        "leaderWorkerTemplate": {
            "size": spec.parallelism.nodes,
            # a group lives and dies as one: a pod that restarts takes its whole group with it
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": _template(spec, pods, True),
            "workerTemplate": _template(spec, pods, False),
        },
    }


def engine_workload(spec: ServiceSpec, owner: dict, pods: EnginePods, replicas: int) -> dict[str, Any]:
    """The service's engine, ``replicas`` engine groups: of the kind engine_kind gives, named
    name_of(spec, "engine")."""
    api_version, kind = engine_kind(spec)
    body = group_set_spec(spec, pods) if spec.parallelism.multi_node else deployment_spec(spec, pods)
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": common.metadata(spec, "engine", owner),
        "spec": {"replicas": replicas, **body},
    }


def engine_kind(spec: ServiceSpec) -> tuple[str, str]:
    """(apiVersion, kind) of the service's engine: a LeaderWorkerSet for multi-node groups, else a
    Deployment (both named name_of(spec, "engine"))."""
    return (API_VERSION, KIND) if spec.parallelism.multi_node else ("apps/v1", "Deployment")


def other_engine_kind(spec: ServiceSpec) -> tuple[str, str]:
    """The kind the engine is not (what a change of parallelism.nodes leaves behind)."""
    return ("apps/v1", "Deployment") if spec.parallelism.multi_node else (API_VERSION, KIND)


def group_api_installed(client) -> bool:
    """Whether the API server serves LeaderWorkerSets (asked of discovery, which every client may read)."""
    group = client.get_quietly(f"/apis/{API_VERSION}") or {}
    return any(resource.get("kind") == KIND for resource in group.get("resources") or [])
