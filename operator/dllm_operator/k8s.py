"""A small Kubernetes REST client over the official client's ApiClient: get, create-or-patch, delete."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlencode

import kubernetes
from kubernetes.client.rest import ApiException

from dllm_operator.config import OperatorSettings

logger = logging.getLogger(__name__)

_PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Job": "jobs",
    "Pod": "pods",
    "ScaledObject": "scaledobjects",
    "DLLMService": "dllmservices",
    "Event": "events",
    "Secret": "secrets",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "NetworkPolicy": "networkpolicies",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceMonitor": "servicemonitors",
    "LeaderWorkerSet": "leaderworkersets",
}


class ChildRejected(Exception):
    """The API server refused a child object (a 4xx other than a conflict): a spec or policy problem that
    retrying will not fix, reported as a condition on the service."""

    def __init__(self, manifest: dict[str, Any], status: int, message: str) -> None:
        meta = manifest.get("metadata") or {}
        super().__init__(f"{manifest.get('kind')} {meta.get('name')} was rejected ({status}): {message}")


def _server_message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body or "{}").get("message") or str(exc.reason)
    except (json.JSONDecodeError, AttributeError):
        return str(exc.reason)


MERGE_PATCH = "application/merge-patch+json"


@contextmanager
def _rejections_of(manifest: dict[str, Any]) -> Iterator[None]:
    """A 4xx (other than a conflict) from writing ``manifest`` raised as ChildRejected."""
    try:
        yield
    except ApiException as exc:
        if 400 <= exc.status < 500 and exc.status != 409:
            raise ChildRejected(manifest, exc.status, _server_message(exc)) from None
        raise


LAST_APPLIED = "dllm.dev/last-applied"  # the manifest the operator last sent, as JSON
# fields the operator sets once and then leaves to another owner (KEDA's HPA sets replicas): never removed
_HANDED_OVER = {("spec", "replicas")}


def _annotated(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest carrying itself as its last-applied annotation."""
    meta = manifest["metadata"]
    annotations = meta.get("annotations") or {}
    sent = json.dumps(manifest, separators=(",", ":"), sort_keys=True)
    return manifest | {"metadata": meta | {"annotations": annotations | {LAST_APPLIED: sent}}}


def _last_applied(current: dict[str, Any]) -> dict[str, Any]:
    text = ((current.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    try:
        last = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return last if isinstance(last, dict) else {}


def _with_removals(
    wanted: dict[str, Any], last: dict[str, Any], path: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``wanted`` plus a null for every key the last manifest set and this one does not (in nested
    objects too; lists are replaced whole by a merge patch anyway)."""
    patch = dict(wanted)
    for key, before in last.items():
        here = (*path, key)
        if here in _HANDED_OVER:
            continue
        if key not in wanted:
            patch[key] = None
        elif isinstance(before, dict) and isinstance(wanted[key], dict):
            patch[key] = _with_removals(wanted[key], before, here)
    return patch


def _owned_patch(current: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as a merge patch that also removes what the operator set before and no longer sets (a
    toleration list dropped from the spec, a rolling-update setting, a node-selector entry: a merge patch
    keeps any key it does not mention). Keys others set (defaults the API server filled in, kubectl's
    restartedAt annotation) are left alone. Node-selector entries are compared with the live object too,
    for objects applied before the last-applied annotation existed."""
    patch = _with_removals(manifest, _last_applied(current))
    pod = ((patch.get("spec") or {}).get("template") or {}).get("spec")
    if pod is None:
        return patch
    live = ((current.get("spec") or {}).get("template") or {}).get("spec") or {}
    wanted = manifest["spec"]["template"]["spec"].get("nodeSelector") or {}
    stale = {key: None for key in live.get("nodeSelector") or {} if key not in wanted}
    if not stale:
        return patch
    selector = (pod.get("nodeSelector") or {}) | stale
    template = patch["spec"]["template"]
    return patch | {
        "spec": patch["spec"] | {"template": template | {"spec": pod | {"nodeSelector": selector}}}
    }


def _base(api_version: str) -> str:
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    return f"{_base(api_version)}/namespaces/{namespace}/{_PLURALS[kind]}"


def object_path(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    return f"{collection_path(manifest['apiVersion'], manifest['kind'], meta['namespace'])}/{meta['name']}"


# what a write (a create or a patch) made in this context checks first; it raises to stop the write
_WRITE_CHECK: ContextVar[Callable[[], None] | None] = ContextVar("dllm_write_check", default=None)


@contextmanager
def writes_checked(check: Callable[[], None]) -> Iterator[None]:
    """Every create or patch this thread makes inside the block calls ``check`` first (a reconcile stops
    writing when its service's deletion begins, however old its view of the service)."""
    token = _WRITE_CHECK.set(check)
    try:
        yield
    finally:
        _WRITE_CHECK.reset(token)


class KubeClient:
    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.api = api

    @classmethod
    def from_settings(cls, settings: OperatorSettings) -> KubeClient:
        if settings.api_url:
            configuration = kubernetes.client.Configuration(host=settings.api_url)
            configuration.verify_ssl = False
            return cls(kubernetes.client.ApiClient(configuration))
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        return cls(kubernetes.client.ApiClient())

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        check = _WRITE_CHECK.get()
        if check is not None and method in ("POST", "PATCH"):
            check()
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        if hasattr(self.api, "param_serialize"):  # kubernetes >= 33 (new generator)
            method, url, headers, body, _ = self.api.param_serialize(
                method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            response = self.api.call_api(method, url, header_params=headers, body=body)
            response.read()
        else:
            response = self.api.call_api(
                path,
                method,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
            )
        if response.status >= 400:
            raise ApiException(status=response.status, reason=response.reason, http_resp=response)
        text = response.data.decode() if response.data else ""
        return json.loads(text) if text else None

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def get_quietly(self, path: str) -> dict[str, Any] | None:
        """``get``, with an object the operator may not read (RBAC without KEDA's API, say) read as absent."""
        try:
            return self.get(path)
        except ApiException as exc:
            if exc.status == 403:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str, labels: dict[str, str] | None = None
    ) -> list[dict]:
        wanted = labels or {}
        path = collection_path(api_version, kind, namespace)
        if wanted:  # the server filters: a namespace's every pod is not ours to read
            path += "?" + urlencode({"labelSelector": ",".join(f"{k}={v}" for k, v in wanted.items())})
        items = (self.get(path) or {}).get("items", [])
        # filtered here as well: not every API server honours label selectors (the test emulator)
        return [
            i
            for i in items
            if all(i.get("metadata", {}).get("labels", {}).get(k) == v for k, v in wanted.items())
        ]

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create, or merge-patch what exists: idempotent, and it never drops fields others own.
        ChildRejected when the API server refuses the object."""
        path, manifest = object_path(manifest), _annotated(manifest)
        with _rejections_of(manifest):
            current = self.get(path)
            created = self._create(manifest) if current is None else None
            if created is not None:
                return created
            return self._call("PATCH", path, _owned_patch(current or {}, manifest), MERGE_PATCH)

    def create_if_absent(self, manifest: dict[str, Any]) -> bool:
        """Create the object unless it exists (then leave it exactly as it is, even if two reconciles
        race: a conflict is not turned into a patch). True when this call created it."""
        return self.get(object_path(manifest)) is None and self._create(manifest) is not None

    def _create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """POST the object; None when it exists already (409), ChildRejected when it is refused."""
        meta = manifest["metadata"]
        collection = collection_path(manifest["apiVersion"], manifest["kind"], meta["namespace"])
        with _rejections_of(manifest):
            try:
                return self._call("POST", collection, manifest)
            except ApiException as exc:
                if exc.status == 409:
                    return None
                raise

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", path, body, MERGE_PATCH)

    def delete(self, path: str, propagation: str = "Background") -> bool:
        """Delete an object and, by default, its dependents (a Job's pods: batch/v1 orphans them otherwise)."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        try:
            self._call("DELETE", path, options)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
