"""A DLLMService whose engine group cannot be placed says so: a pod asking for more GPUs than any node has
(Degraded GroupTooLarge, with how to spread the group, and no pods made to wait for ever), and a pod the
scheduler has found no node for beyond a bound (Unschedulable, with the scheduler's message). The real
Kopf operator against the emulated API server; the tests play the scheduler and the nodes."""

from __future__ import annotations

import datetime

from tests.operator.test_lifecycle import (
    NAME,
    _newest_unfinished_job,
    after_resyncs,
    complete_profiling,
    example,
    until,
)

SCHEDULER = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def _node(name: str, gpus: int, labels: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "uid": f"uid-{name}", "resourceVersion": "1"},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)}},
    }


def _pending_pod(name: str, labels: dict, waited_s: float) -> dict:
    """Play the scheduler: a pod it has found no node for since ``waited_s`` ago."""
    since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=waited_s)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "engine"}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": SCHEDULER,
                    "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ],
        },
    }


def _reason(kube, kind: str) -> str | None:
    return (kube.condition(NAME, kind) or {}).get("reason")


def test_a_group_larger_than_any_node_is_degraded_with_how_to_spread_it(cluster, operator):
    """parallelism.tensor 16 on nodes of 8 GPUs: no profiling Job and no engine asking for 16 GPUs, but a
    condition that says so; spread over two nodes (8 ranks each), the group is rendered."""
    kube = cluster.client()
    for index in range(2):
        kube.core.create_node(_node(f"gpu-{index}", 8, {"nvidia.com/gpu.product": "NVIDIA-H100"}))
    kube.core.create_node(_node("cpu-0", 0))
    manifest = example()
    manifest["spec"]["parallelism"] = {"tensor": 16}
    kube.create_service(manifest)
    until(kube, lambda: _reason(kube, "Degraded") == "GroupTooLarge", what="Degraded GroupTooLarge")
    message = kube.condition(NAME, "Degraded")["message"]
    assert "each engine pod asks for 16 nvidia.com/gpu" in message, message
    assert "no node has more than 8" in message and "set parallelism.nodes to 2" in message, message
    assert kube.condition(NAME, "Ready")["status"] == "False"
    assert kube.jobs() == [] and kube.deployment(f"{NAME}-engine") is None
    patch = {"parallelism": {"tensor": 16, "nodes": 2}, "profiling": {"tokenBudget": 65536}}
    kube.patch_service(NAME, {"spec": patch})
    group_set = until(kube, lambda: kube.group_set(f"{NAME}-engine"), what="the engine LeaderWorkerSet")
    pod = group_set["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    until(kube, lambda: _reason(kube, "Degraded") == "AsExpected", what="no longer Degraded")


def test_a_group_that_fits_a_node_is_not_held_back(cluster, operator):
    kube = cluster.client()
    kube.core.create_node(_node("gpu-0", 8))
    manifest = example()
    manifest["spec"]["parallelism"] = {"tensor": 8}
    kube.create_service(manifest)
    until(kube, lambda: _newest_unfinished_job(kube), what="the profiling Job")
    assert _reason(kube, "Degraded") != "GroupTooLarge"


def test_pods_the_scheduler_cannot_place_for_long_are_a_condition(cluster, operator):
    """A profiling pod unschedulable for a minute is waited for; for ten (past the bound, 300 s), the
    service's Profiled condition says so with the scheduler's words. Then an engine pod likewise: Ready."""
    kube = cluster.client()
    kube.create_service(example())
    job = until(kube, lambda: _newest_unfinished_job(kube), what="the profiling Job")["metadata"]["name"]
    kube.core.create_namespaced_pod("default", _pending_pod(f"{job}-a", {"job-name": job}, waited_s=60))
    after_resyncs(cluster, kube, 3)
    assert _reason(kube, "Profiled") == "Profiling"
    kube.core.delete_namespaced_pod(f"{job}-a", "default")
    kube.core.create_namespaced_pod("default", _pending_pod(f"{job}-b", {"job-name": job}, waited_s=600))
    profiled = until(
        kube,
        lambda: (c := kube.condition(NAME, "Profiled")) and c["reason"] == "Unschedulable" and c,
        what="Profiled=False (Unschedulable)",
    )
    assert f"pod {job}-b has found no node for" in profiled["message"], profiled
    assert SCHEDULER in profiled["message"], profiled
    kube.core.delete_namespaced_pod(f"{job}-b", "default")
    complete_profiling(kube, budget=131072)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    engine_labels = {"app.kubernetes.io/instance": NAME, "app.kubernetes.io/component": "engine"}
    kube.core.create_namespaced_pod("default", _pending_pod("engine-a", engine_labels, waited_s=900))
    ready = until(
        kube,
        lambda: (c := kube.condition(NAME, "Ready")) and c["reason"] == "Unschedulable" and c,
        what="Ready=False (Unschedulable)",
    )
    assert "pod engine-a has found no node for" in ready["message"] and SCHEDULER in ready["message"]
