"""A small Kubernetes REST client over the official client's ApiClient: get, create-or-patch, delete."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
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


def _owned_template_patch(current: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as a merge patch that also drops node-selector entries the operator no longer sets (a
    merge patch keeps keys it does not mention; lists, such as containers and tolerations, are replaced
    whole anyway). Other keys of the live template (defaults the API server filled in, kubectl's
    restartedAt annotation) are left alone."""
    pod = ((manifest.get("spec") or {}).get("template") or {}).get("spec")
    if pod is None:
        return manifest
    live = ((current.get("spec") or {}).get("template") or {}).get("spec") or {}
    wanted = pod.get("nodeSelector") or {}
    selector = wanted | {key: None for key in live.get("nodeSelector") or {} if key not in wanted}
    if not selector:
        return manifest
    template = manifest["spec"]["template"]
    return manifest | {
        "spec": manifest["spec"] | {"template": template | {"spec": pod | {"nodeSelector": selector}}}
    }


def _base(api_version: str) -> str:
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    return f"{_base(api_version)}/namespaces/{namespace}/{_PLURALS[kind]}"


def object_path(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    return f"{collection_path(manifest['apiVersion'], manifest['kind'], meta['namespace'])}/{meta['name']}"


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
        path = object_path(manifest)
        with _rejections_of(manifest):
            current = self.get(path)
            created = self._create(manifest) if current is None else None
            if created is not None:
                return created
            return self._call("PATCH", path, _owned_template_patch(current or {}, manifest), MERGE_PATCH)

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
