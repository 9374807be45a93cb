"""Level-based reconciliation of one DLLMService: desired children from spec and status, applied idempotently.

Order: Redis (managed) -> gateway -> profiling Job -> profile ConfigMap -> engine Deployment
-> autoscaling (KEDA ScaledObject, or the operator's own queue-depth decision) -> status.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from dllm_contracts.profile_summary import ProfileSummary
from dllm_operator import names
from dllm_operator.conditions import condition, set_condition
from dllm_operator.config import OperatorSettings
from dllm_operator.deletion_guard import DeletionGuard, ServiceDeleted
from dllm_operator.k8s import ChildRejected, KubeClient, collection_path, object_path, writes_checked
from dllm_operator.manifests import common
from dllm_operator.manifests.engine import EnginePods, profile_configmap
from dllm_operator.manifests.engine_group import (
    engine_kind,
    engine_workload,
    group_api_installed,
    other_engine_kind,
)
from dllm_operator.manifests.gateway import (
    files_volume_claim,
    gateway_deployment,
    gateway_metrics_service,
    gateway_service,
)
from dllm_operator.manifests.keda import scaled_object
from dllm_operator.manifests.operations import (
    engine_disruption_budget,
    engine_metrics_service,
    service_monitor,
)
from dllm_operator.manifests.redis import (
    AUTH_COMPONENT,
    managed_redis_url,
    redis_auth_secret,
    redis_deployment,
    redis_disruption_budget,
    redis_network_policy,
    redis_service,
    redis_volume_claim,
)
from dllm_operator.placement import placement_problem
from dllm_operator.pod_health import stuck_reason
from dllm_operator.profile_state import ProfileState, ensure_profile
from dllm_operator.scaling import autoscale_engine
from dllm_operator.service_spec import ServiceSpec
from dllm_operator.spec import SpecError, parse_spec

logger = logging.getLogger(__name__)
MANAGED_REDIS_KINDS = [
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("policy/v1", "PodDisruptionBudget"),
]


@dataclass
class Outcome:
    status: dict[str, Any]  # merged into the resource's status
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


class Reconciler:
    def __init__(self, settings: OperatorSettings, client: KubeClient) -> None:
        self.settings = settings
        self.client = client
        self.deletions = DeletionGuard()

    def reconcile(self, body: dict[str, Any], autoscale_now: bool = False) -> Outcome:
        """Bring the children in line with ``body``; nothing once the service is being deleted (the delete
        handler owns what happens then, also when this view of the service is older than its deletion)."""
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            return Outcome({})
        try:
            uid = meta["uid"]
            with self.deletions.reconciling(uid), writes_checked(lambda: self.deletions.check(uid)):
                return self._reconcile(body, autoscale_now)
        except ServiceDeleted:
            return Outcome({})

    def _reconcile(self, body: dict[str, Any], autoscale_now: bool) -> Outcome:
        meta, status = body["metadata"], dict(body.get("status") or {})
        generation = int(meta.get("generation", 1))
        conditions = list(status.get("conditions") or [])
        try:
            spec = parse_spec(meta["name"], meta["namespace"], body.get("spec") or {})
            self._check_supported(spec)
        except SpecError as exc:
            return self._degraded(conditions, generation, "InvalidSpec", str(exc))
        if spec.parallelism.multi_node and not group_api_installed(self.client):
            message = (
                f"parallelism.nodes {spec.parallelism.nodes} runs each engine group as a LeaderWorkerSet, and "
                "the LeaderWorkerSet controller (API leaderworkerset.x-k8s.io/v1) is not installed in this "
                "cluster: install it, or set parallelism.nodes to 1"
            )
            return self._degraded(conditions, generation, "LeaderWorkerSetNotInstalled", message)
        unplaceable = placement_problem(self.client, spec)
        if unplaceable:  # its pods would stay Pending: say why, and make none
            return self._degraded(conditions, generation, "GroupTooLarge", unplaceable)
        owner = {"name": meta["name"], "uid": meta["uid"]}
        try:
            redis_url = self._ensure_redis(spec, owner)
            self._ensure_gateway(spec, owner, redis_url)
            profile = ensure_profile(spec, owner, self.settings, self.client, status.get("profile"))
            return self._after_profile(
                spec, owner, status, conditions, generation, redis_url, profile, autoscale_now
            )
        except ChildRejected as exc:  # retrying cannot help: say so on the resource
            return self._degraded(conditions, generation, "ChildRejected", str(exc))

    # -- steps ----------------------------------------------------------------------------------
    def _check_supported(self, spec: ServiceSpec) -> None:
        if spec.family not in self.settings.supported_families:
            raise SpecError(
                f"model family {spec.family!r} is not supported by this engine image "
                f"(supported: {', '.join(self.settings.supported_families)})"
            )

    def _ensure_redis(self, spec: ServiceSpec, owner: dict) -> str:
        if not spec.redis_managed:  # switched to an external Redis: the managed one goes (its volume and
            # password stay until the service is deleted)
            for api_version, kind in MANAGED_REDIS_KINDS:
                self._delete_child(spec, api_version, kind, "redis")
            return spec.redis_url
        # made once, never patched: running pods hold this password
        self.client.create_if_absent(redis_auth_secret(spec, owner, secrets.token_urlsafe(24)))
        self.client.apply(redis_volume_claim(spec, owner))
        self.client.apply(redis_deployment(spec, owner, self.settings))
        self.client.apply(redis_service(spec, owner))
        self.client.apply(redis_network_policy(spec, owner, self.settings))
        self.client.apply(redis_disruption_budget(spec, owner, self.settings))
        return managed_redis_url(spec)

    def _ensure_gateway(self, spec: ServiceSpec, owner: dict, redis_url: str) -> None:
        if not spec.files_store:  # (switched to a bucket: the volume stays until the service is deleted)
            self.client.apply(files_volume_claim(spec, owner))
        self.client.apply(gateway_deployment(spec, owner, self.settings, redis_url))
        self.client.apply(gateway_service(spec, owner))
        self.client.apply(gateway_metrics_service(spec, owner))
        self.client.apply(engine_metrics_service(spec, owner))
        self.client.apply(engine_disruption_budget(spec, owner))
        if spec.service_monitor:
            self.client.apply(service_monitor(spec, owner))
        else:
            self._delete_child(spec, "monitoring.coreos.com/v1", "ServiceMonitor", "metrics")

    def _after_profile(
        self, spec, owner, status, conditions, generation, redis_url, profile: ProfileState, autoscale_now
    ):
        events: list[tuple[str, str, str]] = []
        previous = status.get("profile") or {}
        base = {
            "observedGeneration": generation,
            "redisUrl": redis_url,
            "selector": common.selector_string(spec, "engine"),
            "endpoint": f"http://{common.service_name(spec)}.{spec.namespace}.svc:{spec.gateway_port}/v1",
        }
        if profile.state == "failed":
            outcome = self._degraded(conditions, generation, "ProfilingFailed", profile.message)
            outcome.status |= base
            return outcome
        if profile.state == "running" and not previous.get("tokenBudget"):
            was = (condition(conditions, "Profiled") or {}).get("reason")
            reason = profile.reason or "Profiling"
            conditions = set_condition(conditions, "Profiled", False, reason, profile.message, generation)
            if previous.get("pendingHash") != profile.profile_hash:
                events.append(("Normal", "Profiling", profile.message))
            if profile.reason and was != reason:
                events.append(("Warning", reason, profile.message))
            status_profile = previous | {"pendingHash": profile.profile_hash}
            return Outcome(
                base
                | {
                    "phase": "Profiling",
                    "profile": status_profile,
                    "conditions": self._not_degraded(conditions, generation),
                },
                events,
            )
        summary = profile.summary
        if profile.state == "ready" and summary is not None:
            if previous.get("hash") != profile.profile_hash:
                events.append(("Normal", "Profiled", f"token budget {summary.token_budget}"))
            current = {
                "hash": profile.profile_hash,
                "tokenBudget": summary.token_budget,
                "result": summary.as_dict(),
                "device": summary.device_name,
                "gpuProduct": summary.gpu_product,
            }
            reason = "ExplicitBudget" if spec.token_budget is not None else "Measured"
            conditions = set_condition(
                conditions, "Profiled", True, reason, f"token budget {summary.token_budget}", generation
            )
        else:  # re-profiling after a memory-affecting change: the engine as it is keeps serving (old model,
            # old budget); the new spec reaches it only with its own profile
            current = previous | {"pendingHash": profile.profile_hash}
            conditions = set_condition(
                conditions, "Profiled", False, "Reprofiling", profile.message, generation
            )
        if profile.state == "ready" and summary is not None:
            self._apply_engine(spec, owner, current, summary, redis_url, status)
        scaling: dict[str, Any] = {}
        self.deletions.check(owner["uid"])  # before the queue-depth check (a Redis that may not answer)
        if autoscale_now and not spec.keda:
            scaling, conditions = autoscale_engine(
                self.client, spec, redis_url, status, events, conditions, generation
            )
        return self._with_readiness(
            spec, base | {"profile": current} | scaling, conditions, generation, events
        )

    def _apply_engine(
        self,
        spec: ServiceSpec,
        owner: dict,
        profile: dict,
        summary: ProfileSummary,
        redis_url: str,
        status: dict,
    ) -> None:
        self.client.apply(profile_configmap(spec, owner, summary.to_json(), profile["hash"]))
        replicas = status.get("replicas", spec.min_replicas)
        replicas = max(spec.min_replicas, min(spec.max_replicas, int(replicas)))
        pods = EnginePods(self.settings, redis_url, profile["hash"], profile.get("gpuProduct"))
        engine = engine_workload(spec, owner, pods, replicas)
        if spec.keda:
            engine["spec"].pop("replicas")
            self.client.apply(scaled_object(spec, owner, redis_url))
        else:  # switched off: a ScaledObject left behind would have its HPA fight the operator
            self._delete_child(spec, "keda.sh/v1alpha1", "ScaledObject", "engine")
        # parallelism.nodes crossed 1: the engine of the other kind goes (its GPUs are the new one's)
        self._delete_child(spec, *other_engine_kind(spec), "engine")
        self.client.apply(engine)

    def _delete_child(self, spec: ServiceSpec, api_version: str, kind: str, component: str) -> None:
        path = f"{collection_path(api_version, kind, spec.namespace)}/{common.name_of(spec, component)}"
        if self.client.get_quietly(path) is not None and self.client.delete(path):
            logger.info(
                "deleted %s %s (no longer wanted by %s)", kind, common.name_of(spec, component), spec.name
            )

    def _with_readiness(self, spec, status: dict, conditions: list, generation: int, events: list) -> Outcome:
        engine, gateway = self._engine(spec), self._deployment(spec, "gateway")
        engine_ready = int((engine.get("status") or {}).get("readyReplicas") or 0)
        gateway_ready = int((gateway.get("status") or {}).get("readyReplicas") or 0)
        scaled_to_zero = bool(engine) and int((engine.get("spec") or {}).get("replicas", 1)) == 0
        # scaled to zero, the gateway still takes requests: they queue and scale the engine up
        ready = gateway_ready >= 1 and (engine_ready >= 1 or scaled_to_zero)
        message = f"{engine_ready} engine and {gateway_ready} gateway replicas ready"
        reason = (
            ("ScaledToZero" if scaled_to_zero and not engine_ready else "Serving") if ready else "Deploying"
        )
        stuck = None if ready else self._stuck_pods(spec)
        if stuck:  # not just slow: an image that cannot be pulled, a container that keeps crashing
            reason, message = stuck
            if (condition(conditions, "Ready") or {}).get("reason") != reason:
                events.append(("Warning", reason, message))
        was_ready = (condition(conditions, "Ready") or {}).get("status") == "True"
        conditions = set_condition(conditions, "Ready", ready, reason, message, generation)
        if ready and not was_ready:
            events.append(("Normal", "Ready", message))
        status["replicas"] = status.get(
            "replicas", int((engine.get("spec") or {}).get("replicas") or spec.min_replicas)
        )
        status |= {
            "readyReplicas": engine_ready,
            "phase": "Ready" if ready else "Deploying",
            "conditions": self._not_degraded(conditions, generation),
        }
        return Outcome(status, events)

    def _stuck_pods(self, spec: ServiceSpec) -> tuple[str, str] | None:
        for component in ("engine", "gateway"):
            labels = common.selector_labels(spec, component)
            stuck = stuck_reason(self.client, spec.namespace, labels, self.settings.unschedulable_after_s)
            if stuck:
                return stuck
        return None

    def _engine(self, spec: ServiceSpec) -> dict[str, Any]:
        """The engine Deployment, or LeaderWorkerSet (its replicas and readyReplicas count whole groups)."""
        path = f"{collection_path(*engine_kind(spec), spec.namespace)}/{common.name_of(spec, 'engine')}"
        return self.client.get(path) or {}

    def _deployment(self, spec: ServiceSpec, component: str) -> dict[str, Any]:
        path = f"{collection_path('apps/v1', 'Deployment', spec.namespace)}/{common.name_of(spec, component)}"
        return self.client.get(path) or {}

    @staticmethod
    def _not_degraded(conditions: list, generation: int) -> list:
        return set_condition(conditions, "Degraded", False, "AsExpected", "", generation)

    @staticmethod
    def _degraded(conditions: list, generation: int, reason: str, message: str) -> Outcome:
        before = condition(conditions, "Degraded") or {}
        repeated = before.get("status") == "True" and before.get("message") == message
        conditions = set_condition(conditions, "Degraded", True, reason, message, generation)
        conditions = set_condition(conditions, "Ready", False, reason, message, generation)
        events = [] if repeated else [("Warning", reason, message)]
        return Outcome(
            {"phase": "Failed", "observedGeneration": generation, "conditions": conditions}, events
        )

    # -- deletion -------------------------------------------------------------------------------
    def delete_children(self, namespace: str, name: str, uid: str) -> int:
        """Delete every child (garbage collection does it too in a real cluster; this is explicit); no
        reconcile of the service writes one after this returns."""
        under_way = self.deletions.begin_deletion(uid)
        deleted = self._delete_children(namespace, name)
        if under_way:  # a reconcile from before the deletion may have written a child since
            if not self.deletions.wait_until_idle(uid):
                logger.warning(
                    "%s/%s: a reconcile under way has not stopped; deleting again anyway", namespace, name
                )
            deleted += self._delete_children(namespace, name)
        return deleted

    def _delete_children(self, namespace: str, name: str) -> int:
        labels = {
            "app.kubernetes.io/instance": names.label_value(name),
            "app.kubernetes.io/managed-by": "dllm-operator",
        }
        kinds = [
            ("apps/v1", "Deployment"),
            ("v1", "Service"),
            ("v1", "ConfigMap"),
            ("batch/v1", "Job"),
            ("keda.sh/v1alpha1", "ScaledObject"),
            ("networking.k8s.io/v1", "NetworkPolicy"),
            ("v1", "PersistentVolumeClaim"),
            ("policy/v1", "PodDisruptionBudget"),
            ("monitoring.coreos.com/v1", "ServiceMonitor"),
            ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
        ]
        deleted = 0
        for api_version, kind in kinds:
            try:
                items = self.client.list(api_version, kind, namespace, labels)
            except Exception as exc:  # e.g. KEDA not installed: nothing of that kind to delete
                logger.debug("cannot list %s: %s", kind, exc)
                continue
            for item in items:
                item = {
                    "apiVersion": api_version,
                    "kind": kind,
                    "metadata": item["metadata"] | {"namespace": namespace},
                }
                deleted += self.client.delete(object_path(item))
        # by name, not listed: listing Secrets would read every Secret of the namespace
        secret = names.child_name(name, AUTH_COMPONENT)
        deleted += self.client.delete(f"{collection_path('v1', 'Secret', namespace)}/{secret}")
        return deleted
