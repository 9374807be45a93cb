"""A reconcile working from an older view of a DLLMService (a watch lagging behind the status patches, as
on a loaded machine) while its finished profiling pod and Job are deleted: with the profile stored for the
current hash, the service never fails and is never profiled again."""

from __future__ import annotations

from engine_pod.serve.redis_server import RedisServer
from tests.operator.cluster import EmulatedCluster
from tests.operator.test_lifecycle import (
    NAME,
    _newest_unfinished_job,
    after_resyncs,
    complete_profiling,
    example,
    until,
)


def phases_sent(cluster: EmulatedCluster) -> list[str | None]:
    """The phase of every status the operator wrote to the service, in order (merge or JSON patches)."""
    path = f"/dllmservices/{NAME}"
    return [
        phase
        for written, body in cluster.emulator.patch_bodies
        if written.removesuffix("/status").endswith(path)
        for phase in _phases(body)
    ]


def _phases(body) -> list[str | None]:
    if isinstance(body, dict):
        return [(body.get("status") or {}).get("phase")]
    operations = [op for op in body or [] if isinstance(op, dict)]
    return [op.get("value") for op in operations if op.get("path") == "/status/phase"] + [
        (op.get("value") or {}).get("phase") for op in operations if op.get("path") == "/status"
    ]


def test_an_older_view_never_fails_the_service_when_its_profiling_pod_and_job_go(cluster, operator):
    with RedisServer() as server:  # a Redis each resync's queue-depth check reaches at once
        kube = cluster.client()
        manifest = example()
        manifest["spec"]["redis"] = {"url": server.url}
        kube.create_service(manifest)
        until(kube, lambda: _newest_unfinished_job(kube), what="the profiling Job")
        until(
            kube,
            lambda: (kube.service(NAME).get("status") or {}).get("phase") == "Profiling",
            what="Profiling",
        )
        # from here on the operator's view of the service stays as it is now: profiling, nothing stored
        cluster.emulator.held.add("dllmservices")
        job = complete_profiling(kube, budget=131072)
        until(
            kube,
            lambda: kube.service(NAME)["status"].get("profile", {}).get("tokenBudget") == 131072,
            what="the measured budget stored (by a reconcile from the older view)",
        )
        for pod in kube.core.list_namespaced_pod("default", label_selector=f"job-name={job}").items:
            kube.core.delete_namespaced_pod(pod.metadata.name, "default")
        after_resyncs(cluster, kube, 2)  # the Job finished, its pod (and termination message) gone
        kube.batch.delete_namespaced_job(job, "default")
        after_resyncs(cluster, kube, 2)  # neither the Job nor its pod
        cluster.emulator.held.discard("dllmservices")
        after_resyncs(cluster, kube, 1)  # the view caught up
    assert "Failed" not in phases_sent(cluster), phases_sent(cluster)
    assert not kube.jobs()  # never profiled again
    status = kube.service(NAME)["status"]
    assert status["phase"] == "Deploying" and status["profile"]["tokenBudget"] == 131072
    assert kube.condition(NAME, "Profiled")["status"] == "True"
    assert kube.condition(NAME, "Degraded")["status"] == "False"
