"""The Helm chart: lints, renders, and every rendered manifest passes strict Kubernetes validation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.helm_tool import helm_binary
from tests.operator.crd_utils import CRD_PATH, admit

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dllm-operator"
K8S_VERSION = "1.33.0"


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True)


def render(*sets: str) -> list[dict]:
    args = ["template", "dllm", str(CHART), "--namespace", "dllm-system", "--include-crds"]
    for value in sets:
        args += ["--set", value]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


DIFFUSION_GEMMA = (  # the example service with family diffusion_gemma (no decoding set: the family's)
    "example.enabled=true",
    "example.family=diffusion_gemma",
    "example.name=diffusiongemma",
    "example.modelUri=google/diffusiongemma-26B-A4B-it",
)


@pytest.mark.parametrize("sets", [(), DIFFUSION_GEMMA], ids=["defaults", "diffusion_gemma"])
def test_lint_strict_passes(sets):
    result = helm("lint", "--strict", str(CHART), *(arg for value in sets for arg in ("--set", value)))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("example.enabled=true", "watchNamespace=serving", "serviceAccount.name=ops"),
        ("imagePullSecrets[0].name=regcred", "workloadServiceAccount=dllm-workload"),
        DIFFUSION_GEMMA,
        ("monitoring.prometheusRule.enabled=true", "monitoring.prometheusRule.labels.release=prometheus"),
    ],
)
def test_every_rendered_manifest_is_valid(sets):
    documents = render(*sets)
    kinds = {doc["kind"] for doc in documents}
    assert {
        "CustomResourceDefinition",
        "Deployment",
        "ClusterRole",
        "ClusterRoleBinding",
        "ServiceAccount",
    } <= kinds
    for doc in documents:
        if doc["kind"] == "DLLMService":
            assert admit(doc["spec"]) == []
        elif doc["kind"] == "PrometheusRule":  # the Prometheus Operator's CRD: not in Kubernetes' schemas
            check_prometheus_rule(doc)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def check_prometheus_rule(doc: dict) -> None:
    """The shape of monitoring.coreos.com/v1's PrometheusRule: groups of named rules, each alert with an
    expression, a duration, a severity and a summary (the expressions are checked against the metrics the
    services export in tests/serving/test_dashboard_metrics.py)."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["metadata"]["name"]
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"} and set(doc["spec"]) == {"groups"}
    for group in doc["spec"]["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
            assert isinstance(rule["expr"], str) and rule["labels"]["severity"] in ("warning", "critical")
            assert rule["annotations"]["summary"] and rule["for"] == "10m"


def test_dashboard_and_alert_rules_render_behind_their_values():
    kinds = {doc["kind"]: doc for doc in render()}
    assert "PrometheusRule" not in kinds  # without the Prometheus Operator's CRDs an install would fail
    dashboard = kinds["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["dllm-serving.json"])["uid"] == "dllm-serving"
    assert not [doc for doc in render("monitoring.dashboard.enabled=false") if doc["kind"] == "ConfigMap"]
    rules = next(
        doc for doc in render("monitoring.prometheusRule.enabled=true") if doc["kind"] == "PrometheusRule"
    )
    assert {rule["alert"] for group in rules["spec"]["groups"] for rule in group["rules"]} >= {
        "DLLMQueueWaitHigh",
        "DLLMTimeToFirstBlockHigh",
        "DLLMTimePerOutputTokenHigh",
        "DLLMEndToEndLatencyHigh",
    }


def test_chart_ships_the_same_crd_as_the_repository():
    assert (CHART / "crds" / CRD_PATH.name).read_text() == CRD_PATH.read_text()


def test_operator_runs_non_root_with_a_read_only_root_filesystem():
    deployment = next(d for d in render() if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert (
        container["command"][:3] == ["kopf", "run", "--standalone"]
        and "dllm_operator" in container["command"]
    )


def test_rbac_is_least_privilege():
    role = next(d for d in render() if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
    secrets = [r for r in role["rules"] if "secrets" in r["resources"]]
    # never list or watch (that reads every Secret of the namespace), never patch someone else's
    assert secrets and set(secrets[0]["verbs"]) == {"get", "create", "delete"}


@pytest.mark.parametrize(
    "bad",
    [
        "image.pullPolicy=Sometimes",
        "resyncSeconds=0",
        "supportedFamilies={gpt2}",
        "unknownKey=1",
        "imagePullSecrets[0].secret=regcred",  # a LocalObjectReference has a name only
        "workloadServiceAccount=Not_A_Name",
        "monitoring.prometheusRule.for=ten minutes",
        "monitoring.prometheusRule.thresholds.failedRatio=2",
        "redisMaxUnavailable=2",  # one Redis pod: 0 or 1
        "keda.namespace=Not_A_Namespace",
    ],
)
def test_values_schema_rejects_bad_values(bad):
    result = helm("template", "dllm", str(CHART), "--set", bad)
    assert result.returncode != 0
    assert (
        "values don't meet the specifications of the schema" in result.stderr
        or "schema" in result.stderr.lower()
    )


def _bindings(documents: list[dict]) -> dict[str, dict]:
    return {d["roleRef"]["name"]: d for d in documents if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}


def test_rbac_grants_no_update_and_stays_in_the_watched_namespace():
    documents = render("watchNamespace=serving")
    roles = [d for d in documents if d["kind"] == "ClusterRole"]
    verbs = {verb for role in roles for rule in role["rules"] for verb in rule["verbs"]}
    assert "update" not in verbs  # the operator patches; update was granted and unused
    main_role = next(r for r in roles if not r["metadata"]["name"].endswith("-discovery"))
    binding = _bindings(documents)[main_role["metadata"]["name"]]
    assert binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] == "serving"
    cluster_wide = next(r for r in roles if r["metadata"]["name"].endswith("-discovery"))
    assert (
        {res for rule in cluster_wide["rules"] for res in rule["resources"]}
        == {
            "customresourcedefinitions",  # Kopf's discovery of its resource (no namespace scanning: one
            "nodes",  # namespace or all of them, never a pattern)  # get only: the GPU product label of the node a profile ran on
        }
    )
    all_namespaces = _bindings(render())[main_role["metadata"]["name"]]
    assert all_namespaces["kind"] == "ClusterRoleBinding"


def _operator_settings(monkeypatch, *sets: str):
    """The operator's settings as the rendered Deployment's environment gives them."""
    from dllm_operator.config import OperatorSettings

    deployment = next(d for d in render(*sets) if d["kind"] == "Deployment")
    for variable in deployment["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in variable:
            monkeypatch.setenv(variable["name"], variable["value"])
    return OperatorSettings.from_env()


def test_keda_and_the_redis_disruption_budget_reach_the_operator_from_the_values(monkeypatch):
    defaults = _operator_settings(monkeypatch)
    assert (defaults.keda_namespace, defaults.keda_operator_app, defaults.redis_max_unavailable) == (
        "keda",
        "keda-operator",
        1,
    )
    chosen = _operator_settings(
        monkeypatch, "keda.namespace=autoscaling", "keda.operatorApp=keda-op", "redisMaxUnavailable=0"
    )
    assert (chosen.keda_namespace, chosen.keda_operator_app, chosen.redis_max_unavailable) == (
        "autoscaling",
        "keda-op",
        0,
    )
