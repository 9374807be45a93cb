"""Deleting a DLLMService while a resync of it is under way: nothing is written for it afterwards.

A resync that began before the deletion holds the older view of the service (no deletionTimestamp). Caught
in the middle of its work (the emulator holds the read that comes just before it applies the engine
Deployment: whether a LeaderWorkerSet of the engine is left over) until the delete handler has deleted the
children, it would go on to create that Deployment again: a child written after its service's delete
handler ran, left for Kopf to notice at its next look (a minute by default).
"""

from __future__ import annotations

import threading

import kmock
import pytest
from dllm_operator.deletion_guard import DeletionGuard, ServiceDeleted

from tests.operator.test_lifecycle import NAME, example, until

ENGINE_PATH = f"/apis/apps/v1/namespaces/default/deployments/{NAME}-engine"
# read by a reconcile right before it applies the engine Deployment (a group of the other kind to delete?)
BEFORE_ENGINE_PATH = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/default/leaderworkersets/{NAME}-engine"
AUTH_SECRET_PATH = f"/api/v1/namespaces/default/secrets/{NAME}-redis-auth"  # the delete handler's last
SERVICE_PATH = f"/apis/dllm.dev/v1alpha1/namespaces/default/dllmservices/{NAME}"


def _services(kube) -> list:
    return kube.custom.list_namespaced_custom_object("dllm.dev", "v1alpha1", "default", "dllmservices")[
        "items"
    ]


def _deleted(cluster, path: str) -> bool:
    return any(deleted == path for deleted, _ in cluster.emulator.deletes)


def _children_written_after_the_delete_handler_began(cluster) -> list[tuple[str, str]]:
    writes = cluster.emulator.writes
    deleted = writes.index((False, "DELETE", SERVICE_PATH))  # the test's delete of the service
    began = next(i for i in range(deleted, len(writes)) if writes[i][:2] == (True, "DELETE"))
    return [
        (method, path)
        for operator, method, path in writes[began:]
        if operator and method in ("POST", "PATCH") and "/dllmservices/" not in path
    ]


def test_a_resync_under_way_when_its_service_is_deleted_writes_no_child_after(cluster, operator):
    kube = cluster.client()
    manifest = example()
    manifest["spec"]["profiling"] = {"tokenBudget": 65536}
    kube.create_service(manifest)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    handled = "dllm.dev/last-handled-configuration"  # Kopf's, once the create handler is done
    until(kube, lambda: handled in kube.service(NAME)["metadata"].get("annotations", {}), what="created")
    cluster.emulator.gate = lambda request: (
        request.method == kmock.method.GET and request.url.path == BEFORE_ENGINE_PATH
    )
    try:
        until(kube, lambda: cluster.emulator.gated.is_set(), what="a resync about to apply the engine")
        kube.custom.delete_namespaced_custom_object("dllm.dev", "v1alpha1", "default", "dllmservices", NAME)
        until(kube, lambda: _deleted(cluster, AUTH_SECRET_PATH), what="the delete handler's pass")
        assert _deleted(cluster, ENGINE_PATH)
    finally:
        cluster.emulator.gate_open.set()  # the resync goes on, from its view of before the deletion
    until(kube, lambda: not _services(kube), what="the finalizer released")
    assert _children_written_after_the_delete_handler_began(cluster) == []
    assert kube.deployment(f"{NAME}-engine") is None, kube.snapshot(NAME)
    assert not kube.jobs() and not kube.core.list_namespaced_config_map("default").items


def test_a_deletion_waits_for_the_reconcile_under_way_within_a_bound_and_refuses_later_ones():
    """The guard itself: a reconcile under way is waited for (up to the bound: an API call that does not
    answer must not hold the delete handler for ever), a later one of the same uid never starts, another
    service's still does."""
    guard = DeletionGuard()
    entered, release = threading.Event(), threading.Event()

    def reconcile():
        with guard.reconciling("deleted"):
            entered.set()
            release.wait()

    under_way = threading.Thread(target=reconcile)
    under_way.start()
    entered.wait()
    assert guard.begin_deletion("deleted")  # one is under way
    assert not guard.wait_until_idle("deleted", timeout_s=0.1)
    release.set()
    under_way.join()
    assert guard.wait_until_idle("deleted", timeout_s=60)
    with pytest.raises(ServiceDeleted), guard.reconciling("deleted"):
        pass
    with guard.reconciling("another"):
        guard.check("another")
