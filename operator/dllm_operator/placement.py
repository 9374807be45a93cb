"""Whether an engine group can be placed at all: a pod that asks for more GPUs than any node has stays
Pending for ever, so the service says so (a condition) instead of waiting without a word.

Judged from the nodes that match the service's node selector and offer its GPU resource: when some do and
none has as many allocatable GPUs as one pod asks for (``parallelism`` ranks / nodes, a GPU each), the
group cannot be placed, and the message says how to spread it. Where no node offers the resource yet (a
cluster autoscaler may add one) nothing is said here: pods that stay unschedulable are (``pod_health``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from dllm_operator.k8s import KubeClient
from dllm_operator.service_spec import ServiceSpec

NODES_PATH = "/api/v1/nodes"


def node_gpus(client: KubeClient, spec: ServiceSpec) -> list[int]:
    """The allocatable GPUs of each node that matches the service's node selector and offers its GPU
    resource (none: none known, or the nodes may not be read)."""
    selector = spec.node_selector
    query = (
        "?" + urlencode({"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())})
        if selector
        else ""
    )
    nodes = (client.get_quietly(NODES_PATH + query) or {}).get("items") or []
    counts = []
    for node in nodes:  # filtered here as well: not every API server honours label selectors
        labels = (node.get("metadata") or {}).get("labels") or {}
        if all(labels.get(key) == value for key, value in selector.items()):
            gpus = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(spec.gpu_resource))
            if gpus > 0:
                counts.append(gpus)
    return counts


def placement_problem(client: KubeClient, spec: ServiceSpec) -> str | None:
    """Why no node can hold one of the group's pods, in one line (None: some node can, or it is unknown)."""
    parallelism = spec.parallelism
    wanted = parallelism.pod_gpus(spec.gpus)
    if wanted <= 1:  # a pod of one GPU fits any node that offers the resource
        return None
    counts = node_gpus(client, spec)
    if not counts or max(counts) >= wanted:
        return None
    largest = max(counts)
    selected = " matching resources.nodeSelector" if spec.node_selector else ""
    return (
        f"each engine pod asks for {wanted} {spec.gpu_resource} ({parallelism.ranks} ranks of a group over "
        f"{parallelism.nodes} node{'s' if parallelism.nodes > 1 else ''}), and no node{selected} has more than "
        f"{largest}: {_advice(parallelism.ranks, largest)}"
    )


def _advice(ranks: int, largest: int) -> str:
    """How to spread ``ranks`` ranks over nodes of ``largest`` GPUs."""
    nodes = next((n for n in range(2, ranks + 1) if ranks % n == 0 and ranks // n <= largest), None)
    if nodes is None:
        return f"choose fewer ranks (parallelism.tensor and parallelism.expert at most {largest} a node)"
    return (
        f"set parallelism.nodes to {nodes} ({ranks // nodes} ranks on each node, with profiling.tokenBudget), "
        "or choose fewer ranks"
    )


def _quantity(value: Any) -> int:
    """A whole-number resource quantity ("8"); anything else counts as none."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0
