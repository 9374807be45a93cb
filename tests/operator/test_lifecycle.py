"""The real Kopf operator against an emulated API server over HTTP: the whole DLLMService lifecycle.

The emulator runs no controllers, so the test plays kubelet and Job controller: it marks the
profiling Job complete with a termination message and marks Deployments ready.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import time
from dataclasses import replace

import kubernetes_validate
import pytest
import redis
import yaml
from dllm_operator.handlers import WATCH_TIMEOUT_S

from dllm_contracts.profile_summary import ProfileSummary, read_profile_file
from dllm_contracts.queue.messages import DoneEvent, QueuedRequest
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from engine_pod.cli.budget import read_profile
from engine_pod.cli.main import build_parser
from engine_pod.cli.scheduling import scheduler_config
from engine_pod.serve.redis_server import RedisServer
from tests.charts.test_chart import CHART, helm
from tests.operator.cluster import LWS_RESOURCE, OPERATOR_CALLS, EmulatedCluster, Kube
from tests.operator.crd_utils import EXAMPLE_PATH

# A wait on the operator is bounded by its work, not by the clock: it gives up once the operator has run
# this many reconciles (each ends with a patch of its service: at a one-second resync, every wait here takes
# a few) without bringing the condition about, however slow the machine makes each of them ...
OPERATOR_CYCLES = 40
# ... or once the operator has made no API call at all for this long: stuck (Kopf re-opens a watch the API
# server left silent after WATCH_TIMEOUT_S; a resync calls the API every second)
OPERATOR_SILENT_S = 3 * WATCH_TIMEOUT_S
POLL_S = 0.1  # the emulator, the operator and this wait share one process: poll it lightly

NAME = "llada-8b"


def until(kube: Kube, predicate, what: str):
    """Wait for the operator to bring about ``predicate`` (returned), for as long as it keeps working
    towards it; when it has given up, say where the service and its children stood."""
    emulator = kube.emulator
    start = len(emulator.service_patches)
    while not (value := predicate()):
        cycles = len(emulator.service_patches) - start
        silent = time.monotonic() - emulator.last_operator_call
        if cycles >= OPERATOR_CYCLES or silent >= OPERATOR_SILENT_S:
            raise AssertionError(
                f"gave up waiting for {what} after {cycles} reconciles, the operator silent for {silent:.0f} s; "
                f"last seen: {kube.snapshot(NAME)!r:.1500}"
            )
        time.sleep(POLL_S)
    return value


def after_resyncs(cluster: EmulatedCluster, kube: Kube, count: int) -> None:
    """Wait for ``count`` more patches of the service (each resync patches its status): what a test that
    checks that nothing changes waits for, however slow the machine."""
    path = f"/dllmservices/{NAME}"

    def patched() -> int:
        return sum(p.removesuffix("/status").endswith(path) for p in cluster.emulator.patches)

    start = patched()
    until(kube, lambda: patched() >= start + count, f"{count} resyncs")


def example() -> dict:
    return yaml.safe_load(EXAMPLE_PATH.read_text())


def measured(budget: int) -> ProfileSummary:
    """A summary as `dllm profile --termination-log` writes it on an 80 GB GPU."""
    return ProfileSummary(
        token_budget=budget,
        device="cuda:0",
        device_name="NVIDIA H100 80GB HBM3",
        dtype="bfloat16",
        total_memory_bytes=85_520_809_984,
        usable_memory_bytes=76_968_728_985,
        weights_bytes=16_031_000_000,
        bytes_per_token=524288.0,
        intercept_bytes=900_000_000,
        r_squared=0.9991,
        held_out_max_error=0.012,
    )


def complete_profiling(
    kube: Kube, budget: int, namespace: str = "default", node: str | None = None, message: str | None = None
) -> str:
    """Play the Job controller and the kubelet: the newest profiling Job succeeds with a result (its
    pod scheduled on ``node`` when given); ``message``: its termination message, if not a valid summary."""
    job = until(kube, lambda: _newest_unfinished_job(kube), what="a profiling Job")
    name = job["metadata"]["name"]
    message = measured(budget).termination_message() if message is None else message
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-x1", "namespace": namespace, "labels": {"job-name": name}},
        "spec": {"containers": [{"name": "profile", "image": "engine"}], "restartPolicy": "Never"}
        | ({"nodeName": node} if node else {}),
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "profile",
                    "ready": False,
                    "restartCount": 0,
                    "image": "engine",
                    "imageID": "",
                    "state": {"terminated": {"exitCode": 0, "message": message}},
                }
            ],
        },
    }
    kube.core.create_namespaced_pod(namespace, pod)
    status = {"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
    kube.batch.patch_namespaced_job_status(name, namespace, status)
    return name


def _newest_unfinished_job(kube: Kube):
    jobs = [j for j in kube.jobs() if not (j.get("status") or {}).get("succeeded")]
    return jobs[-1] if jobs else None


def warned(kube: Kube, reason: str) -> bool:
    """A Warning event with this reason exists (Kopf posts events in the background, after the status)."""
    return any(
        e.reason == reason and e.type == "Warning" for e in kube.core.list_namespaced_event("default").items
    )


def mark_ready(kube: Kube, *names: str) -> None:
    for name in names:
        until(kube, lambda n=name: kube.deployment(n), what=f"deployment {name}")
        kube.apps.patch_namespaced_deployment_status(
            name, "default", {"status": {"readyReplicas": 1, "replicas": 1}}
        )


def engine_memory(kube: Kube) -> str:
    container = kube.deployment(f"{NAME}-engine")["spec"]["template"]["spec"]["containers"][0]
    return container["resources"]["limits"]["memory"]


def test_a_new_model_is_not_rolled_out_on_the_old_budget(cluster, operator):
    kube = cluster.client()
    kube.create_service(example())
    complete_profiling(kube, budget=131072)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    old_model = engine_command(kube)[engine_command(kube).index("--model") + 1]
    jobs = len(kube.jobs())
    kube.patch_service(NAME, {"spec": {"model": {"uri": "GSAI-ML/LLaDA-1.5"}}})
    until(kube, lambda: len(kube.jobs()) == jobs + 1, what="a profiling Job for the new model")
    until(
        kube,
        lambda: (kube.condition(NAME, "Profiled") or {}).get("reason") == "Reprofiling",
        what="Reprofiling",
    )
    command = engine_command(kube)
    assert command[command.index("--model") + 1] == old_model  # still the model its budget was measured on
    complete_profiling(kube, budget=98304)
    until(
        kube,
        lambda: "GSAI-ML/LLaDA-1.5@main" in engine_command(kube),  # the example pins a revision
        what="the new model, with its own budget",
    )
    configmap = kube.core.read_namespaced_config_map(f"{NAME}-profile", "default")
    assert json.loads(configmap.data["profile.json"])["token_budget"] == 98304


def test_engines_are_pinned_to_the_gpu_product_their_budget_was_measured_on(cluster, operator):
    kube = cluster.client()
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-node-7", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    }
    kube.core.create_node(node)
    kube.create_service(example())
    complete_profiling(kube, budget=131072, node="gpu-node-7")
    deployment = until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    selector = deployment["spec"]["template"]["spec"]["nodeSelector"]
    assert selector["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    status = until(
        kube, lambda: kube.service(NAME)["status"].get("profile", {}).get("gpuProduct"), what="status"
    )
    assert status == "NVIDIA-H100-80GB-HBM3"
    kube.patch_service(NAME, {"spec": {"resources": {"pinGpuProduct": False}}})
    until(
        kube,
        lambda: (
            "nvidia.com/gpu.product"
            not in (kube.deployment(f"{NAME}-engine")["spec"]["template"]["spec"].get("nodeSelector") or {})
        ),
        what="the pin lifted",
    )


def test_what_the_spec_no_longer_asks_for_is_removed_from_the_engine(cluster, operator):
    """A merge patch keeps every key it does not mention: tolerations dropped from the spec would stay on
    the pods. The operator removes what it set before and no longer sets (its last-applied annotation)."""
    kube = cluster.client()
    service = example()
    toleration = {"key": "dedicated", "operator": "Equal", "value": "dllm", "effect": "NoSchedule"}
    service["spec"]["resources"]["tolerations"] = [toleration]
    kube.create_service(service)
    complete_profiling(kube, budget=131072)
    deployment = until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    assert deployment["spec"]["template"]["spec"]["tolerations"] == [toleration]
    kube.patch_service(NAME, {"spec": {"resources": {"tolerations": None}}})
    until(
        kube,
        lambda: not kube.deployment(f"{NAME}-engine")["spec"]["template"]["spec"].get("tolerations"),
        what="the tolerations removed",
    )
    spec = kube.deployment(f"{NAME}-engine")["spec"]
    assert spec["replicas"] >= 1 and spec["template"]["spec"]["containers"][0]["command"][:2] == [
        "dllm",
        "worker",
    ]


def test_the_profile_survives_its_job_and_pod_being_deleted(cluster, operator):
    """ttlSecondsAfterFinished deletes the Job after a day; its pod may be garbage-collected or its node
    lost sooner. The measured budget lives in status: no re-profiling, no Failed service."""
    kube = cluster.client()
    kube.create_service(example())
    job = complete_profiling(kube, budget=131072)
    mark_ready(kube, f"{NAME}-engine", f"{NAME}-gateway")
    until(kube, lambda: (kube.condition(NAME, "Ready") or {}).get("status") == "True", what="Ready")
    kube.batch.delete_namespaced_job(job, "default")
    for pod in kube.core.list_namespaced_pod("default").items:
        kube.core.delete_namespaced_pod(pod.metadata.name, "default")
    after_resyncs(cluster, kube, 4)  # with neither the Job nor its pod
    assert not kube.jobs() and not kube.core.list_namespaced_pod("default").items
    status = kube.service(NAME)["status"]
    assert status["phase"] == "Ready" and status["profile"]["tokenBudget"] == 131072
    assert kube.condition(NAME, "Profiled")["status"] == "True"


def test_a_reconcile_from_a_view_older_than_the_stored_profile_does_not_profile_again(cluster, operator):
    """A reconcile may get the service as it was before the status patch that stored its profile (an event
    delivered before it). With the Job gone it must not profile again: the profile ConfigMap, read fresh,
    holds the same fact."""
    from dllm_operator.config import OperatorSettings
    from dllm_operator.k8s import KubeClient
    from dllm_operator.profile_state import ensure_profile
    from dllm_operator.spec import parse_spec

    kube = cluster.client()
    kube.create_service(example())
    job = complete_profiling(kube, budget=131072)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    kube.batch.delete_namespaced_job(job, "default")
    service = kube.service(NAME)
    spec = parse_spec(NAME, "default", service["spec"])
    settings = OperatorSettings.from_env()
    client = KubeClient.from_settings(replace(settings, api_url=cluster.url))
    owner = {"apiVersion": "dllm.dev/v1alpha1", "kind": "DLLMService", "name": NAME, "uid": "u"}
    state = ensure_profile(spec, owner, settings, client, stored=None)  # the older view: nothing stored
    assert state.state == "ready" and state.summary.token_budget == 131072
    assert not kube.jobs()


def test_a_profile_result_that_is_not_the_schema_fails_the_service_with_the_field_named(cluster, operator):
    """A Job that succeeded but reported something the schema does not hold (an older or a broken
    profiler): Degraded ProfilingFailed naming the field, never an engine on a made-up budget."""
    kube = cluster.client()
    kube.create_service(example())
    broken = json.loads(measured(98304).termination_message()) | {"token_budget": "98304"}
    complete_profiling(kube, budget=0, message=json.dumps(broken))
    until(
        kube,
        lambda: (kube.condition(NAME, "Degraded") or {}).get("reason") == "ProfilingFailed",
        what="Degraded ProfilingFailed",
    )
    degraded = kube.condition(NAME, "Degraded")
    assert degraded["status"] == "True" and "token_budget must be int" in degraded["message"]
    assert kube.service(NAME)["status"]["phase"] == "Failed"
    assert kube.deployment(f"{NAME}-engine") is None


def test_the_engine_reads_the_budget_the_operator_stored(cluster, operator, tmp_path):
    """The profile ConfigMap the engine mounts holds the summary the Job reported, GPU product added, and
    `dllm worker --profile` reads its budget from that very file."""
    kube = cluster.client()
    kube.create_service(example())
    complete_profiling(kube, budget=98304)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    configmap = kube.core.read_namespaced_config_map(f"{NAME}-profile", "default")
    path = tmp_path / "profile.json"
    path.write_text(configmap.data["profile.json"])
    assert read_profile_file(path) == measured(98304)
    assert read_profile(str(path)).token_budget == 98304


def test_dllm_serve_engines_take_the_cache_share_the_profile_measured(cluster, operator, tmp_path):
    """The profiling Job's cache_share travels through the status and the profile ConfigMap to the engine,
    which runs --policy dllm-serve with the spec's quota and, the spec setting no cacheShare, takes the
    profile's; a share out of range degrades the service with the field named."""
    kube = cluster.client()
    manifest = example()
    manifest["spec"]["scheduling"] |= {"policy": "dllm-serve", "refreshQuota": 0.3}
    kube.create_service(manifest)
    complete_profiling(kube, 98304, message=replace(measured(98304), cache_share=0.35).termination_message())
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    stored = until(kube, lambda: kube.service(NAME)["status"].get("profile", {}).get("result"), "the profile")
    assert stored["cache_share"] == 0.35
    path = tmp_path / "profile.json"
    path.write_text(kube.core.read_namespaced_config_map(f"{NAME}-profile", "default").data["profile.json"])
    args = build_parser().parse_args(engine_command(kube)[1:])
    assert args.policy == "dllm-serve"
    args.profile = str(path)  # where the pod mounts that ConfigMap
    config = scheduler_config(args)
    assert (config.refresh_quota, config.cache_share, config.token_budget) == (0.3, 0.35, 98304)
    kube.patch_service(NAME, {"spec": {"scheduling": {"cacheShare": 0}}})
    degraded = until(
        kube, lambda: (c := kube.condition(NAME, "Degraded")) and c["status"] == "True" and c, what="Degraded"
    )
    assert "scheduling.cacheShare must be in (0, 1], got 0" in degraded["message"]


def test_the_engines_run_the_specs_head_sparse_cache_and_a_bad_one_degrades(cluster, operator):
    """spec.decoding.sparseCache reaches the engines' dllm worker, its importance file mounted from the
    ConfigMap it names; a retention out of range degrades the service with the field named."""
    kube = cluster.client()
    manifest = example()
    manifest["spec"]["decoding"]["sparseCache"] = {
        "mode": "head-centric",
        "retention": 0.4,
        "headImportanceConfigMap": "llada-heads",
    }
    manifest["spec"]["decoding"]["logitCandidates"] = 16
    kube.create_service(manifest)
    complete_profiling(kube, 98304)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    args = build_parser().parse_args(engine_command(kube)[1:])
    assert (args.sparse_cache, args.retention, args.logit_candidates) == ("head-centric", 0.4, 16)
    volumes = kube.deployment(f"{NAME}-engine")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "llada-heads", "items": [{"key": "heads.json", "path": "heads.json"}]} in [
        v.get("configMap") for v in volumes
    ]
    kube.patch_service(NAME, {"spec": {"decoding": {"sparseCache": {"retention": 1.5}}}})
    degraded = until(
        kube, lambda: (c := kube.condition(NAME, "Degraded")) and c["status"] == "True" and c, what="Degraded"
    )
    assert "decoding.sparseCache.retention must be in (0, 1], got 1.5" in degraded["message"]


def engine_command(kube: Kube) -> list[str]:
    return kube.deployment(f"{NAME}-engine")["spec"]["template"]["spec"]["containers"][0]["command"]


def test_full_lifecycle_of_the_example(cluster, operator):
    kube = cluster.client()
    kube.create_service(example())
    job = until(kube, lambda: _newest_unfinished_job(kube), what="the profiling Job")
    kubernetes_validate.validate(_clean(job), "1.33.0", strict=False)
    assert until(
        kube, lambda: (kube.service(NAME).get("status") or {}).get("phase") == "Profiling", what="Profiling"
    )
    assert kube.deployment(f"{NAME}-engine") is None  # no engine before the budget is known

    complete_profiling(kube, budget=131072)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    configmap = kube.core.read_namespaced_config_map(f"{NAME}-profile", "default")
    assert json.loads(configmap.data["profile.json"])["token_budget"] == 131072
    assert "--profile" in engine_command(kube)
    status = until(
        kube,
        lambda: (s := kube.service(NAME).get("status") or {}).get("profile", {}).get("tokenBudget") and s,
        what="the budget in status",
    )
    assert status["profile"]["tokenBudget"] == 131072
    assert kube.condition(NAME, "Profiled")["status"] == "True"
    assert kube.deployment(f"{NAME}-gateway") and kube.deployment(f"{NAME}-redis")

    mark_ready(kube, f"{NAME}-engine", f"{NAME}-gateway")
    until(kube, lambda: (kube.condition(NAME, "Ready") or {}).get("status") == "True", what="Ready")
    assert kube.service(NAME)["status"]["phase"] == "Ready"
    assert kube.condition(NAME, "Degraded")["status"] == "False"

    # a field that does not change memory rolls the Deployment without re-profiling
    jobs_before = len(kube.jobs())
    kube.patch_service(NAME, {"spec": {"decoding": {"threshold": 0.8}}})
    until(kube, lambda: "0.8" in engine_command(kube), what="the new threshold in the engine pods")
    assert len(kube.jobs()) == jobs_before

    # a field that changes memory re-profiles; the old budget keeps serving until the new one is known
    old_hash = kube.deployment(f"{NAME}-engine")["spec"]["template"]["metadata"]["annotations"][
        "dllm.dev/profile-hash"
    ]
    kube.patch_service(NAME, {"spec": {"resources": {"memory": "80Gi"}}})
    until(kube, lambda: len(kube.jobs()) == jobs_before + 1, what="a second profiling Job")
    until(
        kube,
        lambda: (kube.condition(NAME, "Profiled") or {}).get("reason") == "Reprofiling",
        what="Reprofiling",
    )
    assert kube.service(NAME)["status"]["profile"]["tokenBudget"] == 131072
    # the running engine is left as it is (old memory, old budget) until the new profile exists
    assert engine_memory(kube) != "80Gi"
    complete_profiling(kube, budget=163840)
    until(
        kube, lambda: kube.service(NAME)["status"]["profile"]["tokenBudget"] == 163840, what="the new budget"
    )
    until(kube, lambda: engine_memory(kube) == "80Gi", what="the new spec with its own budget")
    new_hash = kube.deployment(f"{NAME}-engine")["spec"]["template"]["metadata"]["annotations"][
        "dllm.dev/profile-hash"
    ]
    assert new_hash != old_hash  # the pod template changed: the Deployment rolls onto the new budget

    events = kube.core.list_namespaced_event("default").items
    assert {"Profiling", "Profiled", "Ready"} <= {e.reason for e in events}

    kube.custom.delete_namespaced_custom_object("dllm.dev", "v1alpha1", "default", "dllmservices", NAME)
    children = [
        kube.apps.list_namespaced_deployment,
        kube.core.list_namespaced_config_map,
        kube.batch.list_namespaced_job,
        kube.core.list_namespaced_service,
    ]
    until(
        kube,
        lambda: not any(list_children("default").items for list_children in children),
        what="children deleted",
    )
    until(
        kube,
        lambda: (
            not kube.custom.list_namespaced_custom_object("dllm.dev", "v1alpha1", "default", "dllmservices")[
                "items"
            ]
        ),
        what="the finalizer to be released",
    )


def test_queue_depth_in_redis_scales_the_engine(cluster, operator):
    with RedisServer() as server:
        kube = cluster.client()
        manifest = example()
        manifest["spec"]["redis"] = {"url": server.url}
        manifest["spec"]["profiling"] = {"tokenBudget": 65536}
        manifest["spec"]["replicas"] = {
            "min": 1,
            "max": 4,
            "targetQueueDepthPerReplica": 10,
            "scaleDownDelaySeconds": 2,
        }
        kube.create_service(manifest)
        until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
        assert kube.deployment(f"{NAME}-engine")["spec"]["replicas"] == 1
        queue = SyncQueue(redis.Redis.from_url(server.url), QueueOps(f"default-{NAME}"))
        for i in range(35):  # 35 accepted requests, as the gateway enqueues them
            queue.run(
                queue.ops.enqueue(QueuedRequest(f"r-{i}", [1] * (i + 1), RequestParams(max_tokens=16), 0.0))
            )
        until(kube, lambda: kube.deployment(f"{NAME}-engine")["spec"]["replicas"] == 4, what="scale up to 4")
        # the timer patches the Deployment first and the status after it
        until(kube, lambda: kube.service(NAME)["status"].get("queueDepth") == 35, what="status.queueDepth 35")
        claimed = queue.claim("w1", 10_000, 35)
        for item in claimed:  # a worker finishes them all
            queue.complete("w1", item.request.id, DoneEvent([], "length", 1, 0))
        until(
            kube, lambda: kube.deployment(f"{NAME}-engine")["spec"]["replicas"] == 1, what="scale down to 1"
        )
        assert kube.condition(NAME, "Profiled")["reason"] == "ExplicitBudget"
        assert not kube.jobs()  # an explicit budget never profiles


def test_the_operator_sends_a_redis_password_only_from_a_secret_shared_with_it(cluster, operator):
    """Whoever may create a DLLMService must not get the operator to send any Secret of the namespace
    to a Redis of their choosing: the Secret's owner opts in with an annotation."""
    with RedisServer(extra_args=["--requirepass", "queue-pass"]) as server:
        kube = cluster.client()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "queue-auth", "namespace": "default"},
        }
        kube.core.create_namespaced_secret(
            "default", secret | {"data": {"password": base64.b64encode(b"queue-pass").decode()}}
        )
        manifest = example()
        manifest["spec"]["redis"] = {
            "url": server.url,
            "passwordSecretRef": {"name": "queue-auth", "key": "password"},
        }
        manifest["spec"]["profiling"] = {"tokenBudget": 65536}
        manifest["spec"]["replicas"] = {"min": 1, "max": 3, "targetQueueDepthPerReplica": 10}
        kube.create_service(manifest)
        refused = until(
            kube,
            lambda: (c := kube.condition(NAME, "Autoscaling")) and c["status"] == "False" and c,
            what="autoscaling refused the unshared Secret",
        )
        assert refused["reason"] == "RedisUnreachable" and "not shared" in refused["message"]
        until(kube, lambda: warned(kube, "RedisUnreachable"), what="a RedisUnreachable warning event")
        kube.core.patch_namespaced_secret(
            "queue-auth", "default", {"metadata": {"annotations": {"dllm.dev/share-with-operator": "true"}}}
        )
        until(kube, lambda: kube.condition(NAME, "Autoscaling")["status"] == "True", what="autoscaling")


def test_keda_mode_emits_a_scaled_object_and_leaves_replicas_to_it(cluster, operator):
    kube = cluster.client()
    manifest = example()
    manifest["spec"]["replicas"] |= {"keda": True}
    manifest["spec"]["profiling"] = {"tokenBudget": 65536}
    kube.create_service(manifest)
    scaled = until(
        kube,
        lambda: kube.custom.list_namespaced_custom_object("keda.sh", "v1alpha1", "default", "scaledobjects")[
            "items"
        ],
        what="a ScaledObject",
    )
    assert scaled[0]["spec"]["scaleTargetRef"]["name"] == f"{NAME}-engine"
    deployment = until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    assert "replicas" not in deployment["spec"]
    # KEDA's operator (namespace keda, its pods labelled app=keda-operator) may read the queue depth
    until(kube, lambda: _admits_keda(kube), what="the managed Redis admitting KEDA's operator")
    # a changed bound reaches the ScaledObject (patched in place)
    most = scaled[0]["spec"]["maxReplicaCount"] + 1
    kube.patch_service(NAME, {"spec": {"replicas": {"max": most}}})
    until(
        kube,
        lambda: [
            o
            for o in kube.custom.list_namespaced_custom_object(
                "keda.sh", "v1alpha1", "default", "scaledobjects"
            )["items"]
            if o["spec"]["maxReplicaCount"] == most
        ],
        what="the ScaledObject's new maximum",
    )
    # switched off: the ScaledObject goes (its HPA would fight the operator's own autoscaler)
    kube.patch_service(NAME, {"spec": {"replicas": {"keda": False}}})
    until(kube, lambda: not _admits_keda(kube), what="KEDA's operator no longer admitted")
    until(
        kube,
        lambda: (
            not kube.custom.list_namespaced_custom_object("keda.sh", "v1alpha1", "default", "scaledobjects")[
                "items"
            ]
        ),
        what="the ScaledObject deleted",
    )


def _admits_keda(kube: Kube) -> bool:
    policy = kube.network_policy(f"{NAME}-redis") or {"spec": {"ingress": [{"from": []}]}}
    keda = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
        "podSelector": {"matchLabels": {"app": "keda-operator"}},
    }
    return keda in policy["spec"]["ingress"][0]["from"]


def test_switching_managed_redis_off_deletes_it(cluster, operator):
    kube = cluster.client()
    manifest = example()
    manifest["spec"]["profiling"] = {"tokenBudget": 65536}
    kube.create_service(manifest)
    until(kube, lambda: kube.deployment(f"{NAME}-redis"), what="the managed Redis")
    password = kube.core.read_namespaced_secret(f"{NAME}-redis-auth", "default").to_dict()
    assert kube.core.read_namespaced_persistent_volume_claim(f"{NAME}-redis-data", "default")
    until(  # the gateways' files volume, applied with the gateway
        kube,
        lambda: (
            f"{NAME}-gateway-files"
            in {c.metadata.name for c in kube.core.list_namespaced_persistent_volume_claim("default").items}
        ),
        what="the gateways' files volume",
    )
    until(
        kube,  # applied right after the Redis Deployment and Service
        lambda: [
            p
            for p in kube.networking.list_namespaced_network_policy("default").items
            if p.metadata.name == f"{NAME}-redis"
        ],
        what="the managed Redis's NetworkPolicy",
    )
    budget = until(
        kube, lambda: kube.disruption_budget(f"{NAME}-redis"), what="the Redis's disruption budget"
    )
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["metadata"]["ownerReferences"][0]["name"] == NAME
    # changed behind the operator's back: the next reconcile patches it back
    kube.policy.patch_namespaced_pod_disruption_budget(
        f"{NAME}-redis", "default", {"spec": {"maxUnavailable": 0}}
    )
    until(
        kube,
        lambda: kube.disruption_budget(f"{NAME}-redis")["spec"]["maxUnavailable"] == 1,
        what="the disruption budget patched back",
    )
    after_resyncs(cluster, kube, 2)  # the password is made once, never regenerated under running pods
    again = kube.core.read_namespaced_secret(f"{NAME}-redis-auth", "default").to_dict()
    assert (again["string_data"] or again["data"]) == (password["string_data"] or password["data"])
    kube.patch_service(NAME, {"spec": {"redis": {"managed": False, "url": "redis://redis.queue:6379/0"}}})
    until(kube, lambda: kube.deployment(f"{NAME}-redis") is None, what="the managed Redis deleted")
    until(
        kube,
        lambda: (
            not [
                s
                for s in kube.core.list_namespaced_service("default").items
                if s.metadata.name == f"{NAME}-redis"
            ]
        ),
        what="its Service deleted",
    )
    until(kube, lambda: kube.disruption_budget(f"{NAME}-redis") is None, what="its disruption budget deleted")
    until(
        kube,
        lambda: kube.service(NAME)["status"].get("redisUrl") == "redis://redis.queue:6379/0",
        what="the new URL",
    )


def test_a_spec_the_crd_cannot_reject_gives_degraded_without_a_crash(cluster, operator, monkeypatch):
    monkeypatch.setenv("DLLM_SUPPORTED_FAMILIES", "llada")
    from dllm_operator import handlers

    handlers.reset()
    kube = cluster.client()
    manifest = example()
    manifest["spec"]["model"] = {"uri": "Dream-org/Dream-v0-Instruct-7B", "family": "dream"}
    kube.create_service(manifest)
    degraded = until(
        kube, lambda: (c := kube.condition(NAME, "Degraded")) and c["status"] == "True" and c, what="Degraded"
    )
    assert "family 'dream' is not supported" in degraded["message"]
    assert kube.service(NAME)["status"]["phase"] == "Failed"
    assert kube.deployment(f"{NAME}-engine") is None and not kube.jobs()
    # fixing the spec recovers
    kube.patch_service(NAME, {"spec": {"model": {"uri": "GSAI-ML/LLaDA-8B-Instruct", "family": "llada"}}})
    until(kube, lambda: kube.condition(NAME, "Degraded")["status"] == "False", what="recovery")


def test_what_the_engine_would_refuse_for_the_family_degrades_with_no_pods(cluster, operator):
    """dllm-serve on a block-diffusion family: the engines would refuse it at their start (a crash loop);
    the service says why instead, with no profiling Job and no engine, and recovers once it is fixed."""
    kube = cluster.client()
    manifest = yaml.safe_load((EXAMPLE_PATH.parent / "example-llada2-dllmservice.yaml").read_text())
    manifest["metadata"]["name"] = NAME
    manifest["spec"].setdefault("scheduling", {})["policy"] = "dllm-serve"
    kube.create_service(manifest)
    degraded = until(
        kube, lambda: (c := kube.condition(NAME, "Degraded")) and c["status"] == "True" and c, what="Degraded"
    )
    assert degraded["reason"] == "InvalidSpec"
    assert "scheduling.policy: policy dllm-serve staggers the dual cache's refreshes" in degraded["message"]
    assert "not LLaDA2.0 with --cache dual" in degraded["message"]
    assert kube.deployment(f"{NAME}-engine") is None and not kube.jobs()
    kube.patch_service(NAME, {"spec": {"scheduling": {"policy": "blockserve"}}})
    until(kube, lambda: kube.condition(NAME, "Degraded")["status"] == "False", what="recovery")
    until(kube, lambda: _newest_unfinished_job(kube), what="the profiling Job")


@pytest.mark.parametrize(
    "example_file, checkpoint, block",
    [
        ("example-llada2-dllmservice.yaml", "inclusionAI/LLaDA2.0-mini@main", 32),
        ("example-diffusion-gemma-dllmservice.yaml", "google/diffusiongemma-26B-A4B-it@main", 256),
    ],
    ids=["llada2", "diffusion_gemma"],
)
def test_a_service_is_profiled_and_served_with_its_familys_block(
    cluster, operator, example_file, checkpoint, block
):
    """The LLaDA2.0 and DiffusionGemma examples: their profiling Job and their engine run the checkpoint
    they name with their family's block (DiffusionGemma: its 256-token canvas, which its example leaves to
    the family), the budget the Job measured reaches the engine, and a generation length the block does
    not divide is refused with a condition."""
    kube = cluster.client()
    manifest = yaml.safe_load((EXAMPLE_PATH.parent / example_file).read_text())
    manifest["metadata"]["name"] = NAME
    kube.create_service(manifest)
    job = until(kube, lambda: _newest_unfinished_job(kube), what="the profiling Job")
    kubernetes_validate.validate(_clean(job), "1.33.0", strict=False)
    profiled = " ".join(job["spec"]["template"]["spec"]["containers"][0]["command"])
    assert checkpoint in profiled and f"--block-length {block} " in profiled
    complete_profiling(kube, budget=65536)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    command = " ".join(engine_command(kube))
    assert checkpoint in command and "--profile" in command and f"--block-length {block} " in command
    configmap = kube.core.read_namespaced_config_map(f"{NAME}-profile", "default")
    assert json.loads(configmap.data["profile.json"])["token_budget"] == 65536
    mark_ready(kube, f"{NAME}-engine", f"{NAME}-gateway")
    until(kube, lambda: (kube.condition(NAME, "Ready") or {}).get("status") == "True", what="Ready")
    assert kube.service(NAME)["status"]["profile"]["tokenBudget"] == 65536
    kube.patch_service(NAME, {"spec": {"decoding": {"maxGenerationTokens": 300}}})
    degraded = until(
        kube, lambda: (c := kube.condition(NAME, "Degraded")) and c["status"] == "True" and c, what="Degraded"
    )
    assert "blockLength must divide decoding.maxGenerationTokens" in degraded["message"]
    assert f"{manifest['spec']['model']['family']}: {block} and 300" in degraded["message"]


def _waiting_pod(name: str, labels: dict, reason: str, message: str) -> dict:
    """Play the kubelet: a pod whose container waits (an image that cannot be pulled, say)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "missing:1"}]},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": False,
                    "restartCount": 0,
                    "image": "missing:1",
                    "imageID": "",
                    "state": {"waiting": {"reason": reason, "message": message}},
                }
            ],
        },
    }


def test_pods_that_cannot_pull_their_image_are_a_condition_and_an_event(cluster, operator):
    kube = cluster.client()
    kube.create_service(example())
    job = until(kube, lambda: _newest_unfinished_job(kube), what="the profiling Job")["metadata"]["name"]
    pull = 'Back-off pulling image "ghcr.io/dllm-dev/dllm-engine:0.1.0"'
    kube.core.create_namespaced_pod(
        "default", _waiting_pod(f"{job}-a", {"job-name": job}, "ImagePullBackOff", pull)
    )
    profiled = until(
        kube,
        lambda: (c := kube.condition(NAME, "Profiled")) and c["reason"] == "ImagePullBackOff" and c,
        what="Profiled=False (ImagePullBackOff)",
    )
    assert "Back-off pulling image" in profiled["message"]
    kube.core.delete_namespaced_pod(f"{job}-a", "default")
    complete_profiling(kube, budget=131072)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    engine_labels = {"app.kubernetes.io/instance": NAME, "app.kubernetes.io/component": "engine"}
    crash = "back-off 5m0s restarting failed container"
    kube.core.create_namespaced_pod(
        "default", _waiting_pod("engine-a", engine_labels, "CrashLoopBackOff", crash)
    )
    ready = until(
        kube,
        lambda: (c := kube.condition(NAME, "Ready")) and c["reason"] == "CrashLoopBackOff" and c,
        what="Ready=False (CrashLoopBackOff)",
    )
    assert "engine-a" in ready["message"]
    until(
        kube, lambda: warned(kube, "ImagePullBackOff") and warned(kube, "CrashLoopBackOff"), what="warnings"
    )


def test_deleting_a_service_mid_profiling_deletes_the_job_with_its_pod(cluster, operator):
    """batch/v1 orphans a Job's pods unless the delete says otherwise: a pod left holding a GPU. (The
    emulator runs no garbage collector; what is checked is the propagation policy the operator sends.)"""
    kube = cluster.client()
    kube.create_service(example())
    job = until(kube, lambda: _newest_unfinished_job(kube), what="the profiling Job")
    kube.custom.delete_namespaced_custom_object("dllm.dev", "v1alpha1", "default", "dllmservices", NAME)
    until(kube, lambda: not kube.jobs(), what="the Job deleted")
    deletes = [
        body for path, body in cluster.emulator.deletes if path.endswith(f"/jobs/{job['metadata']['name']}")
    ]
    assert deletes and all(
        (body or {}).get("propagationPolicy") in ("Background", "Foreground") for body in deletes
    )


def test_a_child_the_api_server_rejects_gives_degraded_and_an_event(cluster, operator):
    kube = cluster.client()

    def quota(request) -> str | None:
        return (
            "exceeded quota: gpu-quota, requested: nvidia.com/gpu=1" if "/jobs" in request.url.path else None
        )

    cluster.emulator.reject = quota
    kube.create_service(example())
    degraded = until(
        kube, lambda: (c := kube.condition(NAME, "Degraded")) and c["status"] == "True" and c, what="Degraded"
    )
    assert degraded["reason"] == "ChildRejected" and "exceeded quota" in degraded["message"]
    assert kube.service(NAME)["status"]["phase"] == "Failed"
    until(kube, lambda: warned(kube, "ChildRejected"), what="a ChildRejected warning event")
    cluster.emulator.reject = None  # the quota is raised: the next resync recovers
    until(kube, lambda: kube.condition(NAME, "Degraded")["status"] == "False", what="recovery")
    assert _newest_unfinished_job(kube)


def test_a_service_scaled_to_zero_is_ready_and_lists_are_filtered_by_label(cluster, operator):
    with RedisServer() as server:
        kube = cluster.client()
        manifest = example()
        manifest["spec"]["redis"] = {"url": server.url}
        manifest["spec"]["profiling"] = {"tokenBudget": 65536}
        manifest["spec"]["replicas"] = {"min": 0, "max": 2, "targetQueueDepthPerReplica": 10}
        kube.create_service(manifest)
        until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
        assert kube.deployment(f"{NAME}-engine")["spec"]["replicas"] == 0  # nothing queued
        mark_ready(kube, f"{NAME}-gateway")
        ready = until(
            kube, lambda: (c := kube.condition(NAME, "Ready")) and c["status"] == "True" and c, what="Ready"
        )
        assert ready["reason"] == "ScaledToZero"  # requests are taken, queued, and scale the engine up
    pod_lists = [query for path, query in cluster.emulator.lists if path.endswith("/pods")]
    assert all("labelSelector" in query for query in pod_lists), pod_lists


def _clean(manifest: dict) -> dict:
    """An object as submitted (the emulator echoes what it stored)."""
    cleaned = copy.deepcopy(manifest)
    cleaned.pop("status", None)
    return cleaned


assert os.environ.get("DLLM_OPERATOR_RESYNC_S") == "1"


def test_a_service_monitor_follows_its_setting(cluster, operator):
    """monitoring.serviceMonitor makes a ServiceMonitor (applied again at every resync, never twice)
    and switching it off removes it."""
    kube = cluster.client()
    manifest = example()
    manifest["spec"]["profiling"] = {"tokenBudget": 65536}
    manifest["spec"]["monitoring"] = {"serviceMonitor": True}
    kube.create_service(manifest)

    def monitors() -> list:
        listed = kube.custom.list_namespaced_custom_object(
            "monitoring.coreos.com", "v1", "default", "servicemonitors"
        )
        return listed["items"]

    until(kube, monitors, what="the ServiceMonitor")
    after_resyncs(cluster, kube, 2)
    assert len(monitors()) == 1
    kube.patch_service(NAME, {"spec": {"monitoring": {"serviceMonitor": False}}})
    until(kube, lambda: not monitors(), what="the ServiceMonitor removed")


def _argument(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def _profile_status(kube: Kube) -> dict:
    return (kube.service(NAME).get("status") or {}).get("profile") or {}


def test_a_budget_measured_at_one_tensor_size_is_not_used_at_another(cluster, operator):
    """A budget is per rank of a group of one size: a new parallelism.tensor is profiled again, at the new
    size and with its engine pods' GPUs and shared memory; the engine as it was serves meanwhile."""
    kube = cluster.client()
    kube.create_service(example())
    complete_profiling(kube, budget=131072)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    assert _argument(engine_command(kube), "--tensor-parallel") is None
    jobs = len(kube.jobs())
    kube.patch_service(NAME, {"spec": {"parallelism": {"tensor": 4}}})
    job = until(kube, lambda: len(kube.jobs()) > jobs and _newest_unfinished_job(kube), what="a new Job")
    pod = job["spec"]["template"]["spec"]
    assert _argument(pod["containers"][0]["command"], "--tensor-parallel") == "4"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in pod["volumes"]
    until(
        kube,
        lambda: (kube.condition(NAME, "Profiled") or {}).get("reason") == "Reprofiling",
        what="Reprofiling",
    )
    assert _argument(engine_command(kube), "--tensor-parallel") is None  # its budget is a size-1 budget
    at_four = replace(measured(65536), tensor_parallel=4)
    complete_profiling(kube, budget=65536, message=at_four.termination_message())
    until(kube, lambda: _argument(engine_command(kube), "--tensor-parallel") == "4", what="the engine at 4")
    engine = kube.deployment(f"{NAME}-engine")["spec"]["template"]["spec"]
    assert engine["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    configmap = kube.core.read_namespaced_config_map(f"{NAME}-profile", "default")
    stored = json.loads(configmap.data["profile.json"])
    assert (stored["token_budget"], stored["tensor_parallel"]) == (65536, 4)
    until(kube, lambda: _profile_status(kube).get("tokenBudget") == 65536, what="the new budget in status")


def test_a_profile_measured_at_another_size_than_asked_fails_the_service(cluster, operator):
    """An engine image that ran the profile at another size (one without --tensor-parallel, say) gives no
    budget: Degraded ProfilingFailed saying both sizes, and no engine."""
    kube = cluster.client()
    manifest = example()
    manifest["spec"]["parallelism"] = {"tensor": 4}
    kube.create_service(manifest)
    complete_profiling(kube, budget=131072)  # a summary of size 1
    until(
        kube,
        lambda: (kube.condition(NAME, "Degraded") or {}).get("reason") == "ProfilingFailed",
        what="Degraded ProfilingFailed",
    )
    assert "tensor-parallel size 1, and the service runs at 4" in kube.condition(NAME, "Degraded")["message"]
    assert kube.deployment(f"{NAME}-engine") is None


def _group_command(group_set: dict, role: str) -> list[str]:
    return group_set["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]["command"]


def test_eight_ranks_over_two_nodes_serve_as_a_leader_worker_set(cluster, operator):
    """parallelism.nodes 2: the engine is a LeaderWorkerSet of groups of two pods, ready when its groups
    are; back to one node, a Deployment takes its place."""
    kube = cluster.client()
    manifest = example()
    manifest["spec"] |= {"parallelism": {"tensor": 8, "nodes": 2}, "profiling": {"tokenBudget": 65536}}
    kube.create_service(manifest)
    group_set = until(kube, lambda: kube.group_set(f"{NAME}-engine"), what="the engine LeaderWorkerSet")
    assert (
        group_set["spec"]["leaderWorkerTemplate"]["size"] == 2 and kube.deployment(f"{NAME}-engine") is None
    )
    leader, worker = (_group_command(group_set, role) for role in ("leaderTemplate", "workerTemplate"))
    assert (_argument(leader, "--tensor-parallel"), _argument(leader, "--nodes")) == ("8", "2")
    assert (_argument(leader, "--node-rank"), _argument(worker, "--node-rank")) == (
        "0",
        "$(LWS_WORKER_INDEX)",
    )
    kube.custom.patch_namespaced_custom_object_status(
        "leaderworkerset.x-k8s.io",
        "v1",
        "default",
        "leaderworkersets",
        f"{NAME}-engine",
        {"status": {"readyReplicas": 1, "replicas": 1}},
    )
    mark_ready(kube, f"{NAME}-gateway")
    until(kube, lambda: (kube.condition(NAME, "Ready") or {}).get("status") == "True", what="Ready")
    assert kube.service(NAME)["status"]["readyReplicas"] == 1
    kube.patch_service(NAME, {"spec": {"parallelism": {"nodes": 1}}})
    deployment = until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    assert (
        deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        == "8"
    )
    until(kube, lambda: kube.group_set(f"{NAME}-engine") is None, what="the LeaderWorkerSet deleted")


def test_a_multi_node_service_without_the_leader_worker_set_api_says_so(cluster, operator):
    """Without the LeaderWorkerSet controller (its API absent from discovery) a multi-node service is
    Degraded with the reason and what to do; once it is installed, the next resync renders the group."""
    kube = cluster.client()
    installed = cluster.emulator.resources.pop(LWS_RESOURCE)
    manifest = example()
    manifest["spec"] |= {"parallelism": {"tensor": 8, "nodes": 2}, "profiling": {"tokenBudget": 65536}}
    kube.create_service(manifest)
    until(
        kube,
        lambda: (kube.condition(NAME, "Degraded") or {}).get("reason") == "LeaderWorkerSetNotInstalled",
        what="Degraded LeaderWorkerSetNotInstalled",
    )
    message = kube.condition(NAME, "Degraded")["message"]
    assert "LeaderWorkerSet controller" in message and "set parallelism.nodes to 1" in message
    assert kube.service(NAME)["status"]["phase"] == "Failed"
    cluster.emulator.resources[LWS_RESOURCE] = installed
    until(kube, lambda: kube.group_set(f"{NAME}-engine"), what="the LeaderWorkerSet once its API is there")


def test_the_charts_rbac_grants_exactly_the_calls_the_operator_made(request):
    """Every API call the operator made in this module's lifecycles (recorded by the emulator, the
    tests' own calls left out) is granted by the chart's ClusterRoles, and every grant was used. Runs
    last in the module: with only some of its tests selected, only the first half is checked."""
    granted = _chart_grants()
    made = set(OPERATOR_CALLS)
    assert made, "the lifecycle tests before this one record the operator's calls"
    assert not made - granted, f"the operator calls what the chart does not grant: {sorted(made - granted)}"
    module_tests = [item for item in request.session.items if item.module is request.module]
    if len(module_tests) < len([name for name in globals() if name.startswith("test_")]):
        pytest.skip("not every lifecycle test ran: unused grants cannot be told apart")
    assert not granted - made, f"the chart grants what the operator never calls: {sorted(granted - made)}"


def _chart_grants() -> set[tuple[str, str, str]]:
    rendered = helm("template", "dllm", str(CHART)).stdout
    grants = set()
    for document in yaml.safe_load_all(rendered):
        if document and document["kind"] in ("ClusterRole", "Role"):
            for rule in document["rules"]:
                for group in rule["apiGroups"]:
                    grants |= {(group, r, v) for r in rule["resources"] for v in rule["verbs"]}
    return grants
