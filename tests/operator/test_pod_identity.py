"""The chart's ``imagePullSecrets`` and ``workloadServiceAccount`` reach every pod the operator creates:
the chart renders them into the operator's environment, and the real operator (against kmock) puts them
in the engine, gateway, profiling and managed Redis pod specs, which still pass strict validation."""

from __future__ import annotations

import json
import urllib.request

import kubernetes_validate
import pytest
from dllm_operator.config import OperatorSettings
from dllm_operator.manifests.engine import EnginePods
from dllm_operator.manifests.engine_group import engine_workload
from dllm_operator.manifests.gateway import gateway_deployment
from dllm_operator.manifests.profiling import profiling_job
from dllm_operator.manifests.redis import managed_redis_url, redis_deployment
from dllm_operator.profile_state import profile_hash_of
from dllm_operator.spec import parse_spec

from tests.charts.test_chart import K8S_VERSION, render
from tests.operator.cluster import TEST_AGENT, EmulatedCluster
from tests.operator.test_lifecycle import NAME, _newest_unfinished_job, complete_profiling, example, until

CHART_VALUES = (
    "imagePullSecrets[0].name=regcred",
    "imagePullSecrets[1].name=mirror-cred",
    "workloadServiceAccount=dllm-workload",
)
PULL_SECRETS = [{"name": "regcred"}, {"name": "mirror-cred"}]
TESTS_OWN = {"DLLM_OPERATOR_RESYNC_S"}  # the tests' one-second resync stays


@pytest.fixture
def chart_environment(monkeypatch) -> dict[str, str]:
    """The operator's environment as the chart renders it with CHART_VALUES (the literal values; the
    pod's own namespace, from the downward API, is left out)."""
    deployment = next(d for d in render(*CHART_VALUES) if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == PULL_SECRETS  # the operator's own
    env = {
        variable["name"]: variable["value"]
        for variable in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in variable and variable["name"] not in TESTS_OWN
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def stored(cluster: EmulatedCluster, path: str) -> dict:
    """An object exactly as the operator sent it (the emulator stores what it is given), status left out."""
    request = urllib.request.Request(cluster.url + path, headers={"User-Agent": TEST_AGENT})
    with urllib.request.urlopen(request, timeout=30) as response:
        manifest = json.load(response)
    manifest.pop("status", None)
    return manifest


def assert_pods_pull_with_the_charts_secrets(manifest: dict) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    pod = manifest["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == PULL_SECRETS, manifest["metadata"]["name"]
    assert pod["serviceAccountName"] == "dllm-workload", manifest["metadata"]["name"]


def test_every_pod_the_operator_creates_pulls_with_the_charts_secrets(chart_environment, cluster, operator):
    assert chart_environment["DLLM_IMAGE_PULL_SECRETS"] == "regcred,mirror-cred"
    kube = cluster.client()
    kube.create_service(example())
    job = until(kube, lambda: _newest_unfinished_job(kube), what="the profiling Job")["metadata"]["name"]
    assert_pods_pull_with_the_charts_secrets(stored(cluster, f"/apis/batch/v1/namespaces/default/jobs/{job}"))
    complete_profiling(kube, budget=131072)
    until(kube, lambda: kube.deployment(f"{NAME}-engine"), what="the engine Deployment")
    for component in ("engine", "gateway", "redis"):
        path = f"/apis/apps/v1/namespaces/default/deployments/{NAME}-{component}"
        assert_pods_pull_with_the_charts_secrets(stored(cluster, path))


def test_without_settings_the_pods_keep_their_namespaces_defaults():
    """No pull secret and no ServiceAccount named: the pod specs leave both to the namespace."""
    settings = OperatorSettings()
    spec = parse_spec(NAME, "default", example()["spec"])
    digest = profile_hash_of(spec, settings.engine_image)
    url = managed_redis_url(spec)
    for manifest in (
        profiling_job(spec, {"name": NAME, "uid": "u"}, settings, digest),
        engine_workload(spec, {"name": NAME, "uid": "u"}, EnginePods(settings, url, digest), 1),
        gateway_deployment(spec, {"name": NAME, "uid": "u"}, settings, url),
        redis_deployment(spec, {"name": NAME, "uid": "u"}, settings),
    ):
        pod = manifest["spec"]["template"]["spec"]
        assert "imagePullSecrets" not in pod and "serviceAccountName" not in pod


def test_the_setting_is_read_as_a_list_of_names(monkeypatch):
    monkeypatch.setenv("DLLM_IMAGE_PULL_SECRETS", " regcred, ,mirror-cred ")
    monkeypatch.setenv("DLLM_WORKLOAD_SERVICE_ACCOUNT", "dllm-workload")
    settings = OperatorSettings.from_env()
    assert settings.image_pull_secrets == ("regcred", "mirror-cred")
    assert settings.workload_service_account == "dllm-workload"
