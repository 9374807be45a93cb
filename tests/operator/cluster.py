"""An emulated Kubernetes API (kmock) served over HTTP from a background thread, and a client for it."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
import kubernetes

CRD_VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}
TEST_AGENT = "dllm-tests"  # the User-Agent of the tests' own client: its calls are not the operator's
# (API group, resource[/subresource], RBAC verb) of every call anything but the tests made: the operator's
OPERATOR_CALLS: set[tuple[str, str, str]] = set()
LWS_RESOURCE = "leaderworkerset.x-k8s.io/v1/leaderworkersets"  # installed unless a test uninstalls it
HELD_POLL_S = 0.05  # how often a held watch looks whether it may go on


def rbac_verb(request) -> str:
    """The verb RBAC checks for a request (kmock's UPDATE is a PATCH or a PUT)."""
    action = request.action.value.lower()
    if action == "fetch":
        return "get"
    if action == "update":
        return "patch" if request.method == kmock.method.PATCH else "update"
    return action


class Emulator(kmock.KubernetesEmulator):
    """Three gaps of kmock 0.8 filled as a real API server would: a missing object is a 404 (not a
    bare 500), ``metadata.generateName`` gets a unique name (Kopf names its events so), and every write
    gives its object a new ``resourceVersion`` (without it Kopf took the echo of an older write for news
    and ran a handler again for a change it had handled).

    For tests: ``deletes`` records every DELETE (path and body, to check propagation policies), and
    ``reject`` (a function of the request returning a message or None) plays an admission webhook or a
    quota that refuses an object with 422. ``held`` (resource plurals) holds back their watch events
    until the plural leaves it: a watcher keeps working from an older view, as a loaded API server or
    a slow watch leaves it. ``gate`` holds the operator's requests it matches until ``gate_open``: the
    operator caught in the middle of its work, as a slow API server leaves it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deletes: list[tuple[str, Any]] = []
        # (the operator's?, method, path) of every write, in order
        self.writes: list[tuple[bool, str, str]] = []
        self.lists: list[tuple[str, dict[str, str]]] = []  # (path, query) of every list of a collection
        self.patches: list[str] = []  # the path of every PATCH (each resync patches its service's status)
        self.patch_bodies: list[tuple[str, Any]] = []  # (path, body) of every PATCH
        self.reject: Callable[[Any], str | None] | None = None
        self.held: set[str] = set()
        # the operator's work, to bound a wait by it: when it last called, and the path of its every PATCH of
        # a DLLMService (each reconcile, resync or handler, ends with one of its service's status)
        self.last_operator_call = time.monotonic()
        self.service_patches: list[str] = []
        # ``gate``: operator requests it matches wait until ``gate_open`` is set (a reconcile caught mid-way)
        self.gate: Callable[[Any], bool] | None = None
        self.gate_open = threading.Event()
        self.gated = threading.Event()  # a request waited at the gate
        self._versions = itertools.count(2)  # resourceVersions (a test's objects are created at "1")

    async def _serve_watch(self, request):
        async for event in super()._serve_watch(request):
            while event and request.resource.plural in self.held:  # set and cleared by the test's thread
                await asyncio.sleep(HELD_POLL_S)
            yield event

    def _stamp_version(self, request) -> None:
        """Every write gives its object a new resourceVersion, as a real API server does (kmock keeps the
        one it was created with): Kopf then tells its own patches' echoes from older events, and a JSON
        patch that tests an older version fails with 422."""
        if request.resource is None or request.action not in (kmock.action.CREATE, kmock.action.UPDATE):
            return
        version = str(next(self._versions))
        if isinstance(request.data, dict):
            request.data.setdefault("metadata", {})["resourceVersion"] = version
        elif isinstance(request.data, list):  # a JSON patch: after its own tests
            request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})

    async def _pass_gate(self, request) -> None:
        if self.gate is None or not self.gate(request):
            return
        self.gated.set()
        while not self.gate_open.is_set():  # set by the test's thread
            await asyncio.sleep(HELD_POLL_S)

    async def _handle(self, request):
        try:
            return await self._answer(request)
        finally:
            self._forget(request)

    def _forget(self, request) -> None:
        """Drop a request once answered. kmock keeps every request it was sent and finds each new one's
        reaction by scanning them all: a cost that grows with the test (half the CPU of a long operator
        test went to it). The tests read the records above, never kmock's; the requests still in flight
        (watches among them) stay, for kmock to match."""
        for index, seen in enumerate(self._requests):
            if seen is request:
                del self._requests[index]
                return

    async def _answer(self, request):
        known = request.resource is not None and request.resource.plural and request.action is not None
        operator = request.headers.get("User-Agent") != TEST_AGENT
        if known and operator:  # discovery has no resource
            resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
            OPERATOR_CALLS.add((request.resource.group or "", resource, rbac_verb(request)))
        if request.method in (kmock.method.POST, kmock.method.PATCH, kmock.method.DELETE):
            self.writes.append((operator, request.method.name, request.url.path))
        if operator:
            self.last_operator_call = time.monotonic()
            if known and request.method == kmock.method.PATCH and request.resource.plural == "dllmservices":
                self.service_patches.append(request.url.path)
            await self._pass_gate(request)
        if request.method == kmock.method.DELETE:
            self.deletes.append((request.url.path, request.data))
        if request.method == kmock.method.PATCH:
            self.patches.append(request.url.path)
            self.patch_bodies.append((request.url.path, request.data))
        if request.action == kmock.action.LIST:
            self.lists.append((request.url.path, dict(request.url.query)))
        refusal = self.reject(request) if self.reject and request.method != kmock.method.GET else None
        if refusal:
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 422,
                "message": refusal,
            }
            return aiohttp.web.json_response(body, status=422)
        data = request.data if request.action == kmock.action.CREATE else None
        meta = data.get("metadata") if isinstance(data, dict) else None
        if isinstance(meta, dict) and meta.get("generateName") and not meta.get("name"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        self._stamp_version(request)
        try:
            return await super()._handle(request)
        except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as exc:  # a stale resourceVersion
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 422,
                "message": str(exc),
            }
            return aiohttp.web.json_response(body, status=422)
        except kmock.KubernetesError as exc:
            body = {
                "apiVersion": "v1",
                "kind": "Status",
                "status": "Failure",
                "code": exc.status,
                "reason": exc.reason,
                "message": exc.message,
            }
            return aiohttp.web.json_response(body, status=exc.status)


class EmulatedCluster:
    def __init__(self) -> None:
        self.emulator = Emulator()
        self.emulator.resources.load_bundled()
        self.emulator.resources["dllm.dev/v1alpha1/dllmservices"] = kmock.ResourceInfo(
            kind="DLLMService", namespaced=True, verbs=CRD_VERBS, subresources={"status"}
        )
        self.emulator.resources["keda.sh/v1alpha1/scaledobjects"] = kmock.ResourceInfo(
            kind="ScaledObject", namespaced=True, verbs=CRD_VERBS, subresources={"status"}
        )
        self.emulator.resources["monitoring.coreos.com/v1/servicemonitors"] = kmock.ResourceInfo(
            kind="ServiceMonitor", namespaced=True, verbs=CRD_VERBS, subresources=set()
        )
        self.emulator.resources[LWS_RESOURCE] = kmock.ResourceInfo(
            kind="LeaderWorkerSet", namespaced=True, verbs=CRD_VERBS, subresources={"status", "scale"}
        )
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with kmock.Server(self.emulator, host="127.0.0.1") as server:
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> EmulatedCluster:
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the emulated API server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=20)

    def client(self) -> Kube:
        configuration = kubernetes.client.Configuration(host=self.url)
        configuration.verify_ssl = False
        api = kubernetes.client.ApiClient(configuration)
        api.user_agent = TEST_AGENT
        return Kube(api, self.emulator)


class Kube:
    """Typed clients of the official kubernetes package, pointed at the emulator."""

    def __init__(self, api: kubernetes.client.ApiClient, emulator: Emulator) -> None:
        self.emulator = emulator  # what the operator did (its calls), for waits bounded by its work
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.apps = kubernetes.client.AppsV1Api(api)
        self.batch = kubernetes.client.BatchV1Api(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.networking = kubernetes.client.NetworkingV1Api(api)
        self.policy = kubernetes.client.PolicyV1Api(api)

    def create_service(self, manifest: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("resourceVersion", "1")
        meta.setdefault("generation", 1)
        return self.custom.create_namespaced_custom_object(
            "dllm.dev", "v1alpha1", meta["namespace"], "dllmservices", manifest
        )

    def service(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            "dllm.dev", "v1alpha1", namespace, "dllmservices", name
        )

    def patch_service(self, name: str, patch: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
        current = self.service(name, namespace)
        patch.setdefault("metadata", {})["generation"] = int(current["metadata"].get("generation", 1)) + 1
        return self.custom.patch_namespaced_custom_object(
            "dllm.dev", "v1alpha1", namespace, "dllmservices", name, patch
        )

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        conditions = (self.service(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), None)

    def deployment(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        try:
            return self.apps.api_client.sanitize_for_serialization(
                self.apps.read_namespaced_deployment(name, namespace)
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def network_policy(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self._read(self.networking.read_namespaced_network_policy, name, namespace)

    def disruption_budget(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self._read(self.policy.read_namespaced_pod_disruption_budget, name, namespace)

    def _read(self, read, name: str, namespace: str) -> dict[str, Any] | None:
        """An object as plain JSON (None when absent)."""
        try:
            return self.core.api_client.sanitize_for_serialization(read(name, namespace))
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def snapshot(self, name: str, namespace: str = "default") -> dict[str, Any]:
        """What a test that gave up waiting saw: the service's phase and conditions, and its children."""
        try:
            status = self.service(name, namespace).get("status") or {}
        except kubernetes.client.ApiException as exc:
            status = {"service": f"HTTP {exc.status}"}
        conditions = {c["type"]: (c["status"], c.get("reason")) for c in status.get("conditions") or []}
        listed = {
            "deployments": self.apps.list_namespaced_deployment,
            "jobs": self.batch.list_namespaced_job,
            "configmaps": self.core.list_namespaced_config_map,
            "services": self.core.list_namespaced_service,
        }
        children = {kind: [i.metadata.name for i in call(namespace).items] for kind, call in listed.items()}
        return {"phase": status.get("phase"), "conditions": conditions, **children}

    def group_set(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """A LeaderWorkerSet (None when absent)."""
        try:
            return self.custom.get_namespaced_custom_object(
                "leaderworkerset.x-k8s.io", "v1", namespace, "leaderworkersets", name
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def jobs(self, namespace: str = "default") -> list[dict[str, Any]]:
        listed = self.batch.list_namespaced_job(namespace)
        return [self.batch.api_client.sanitize_for_serialization(j) for j in listed.items]
