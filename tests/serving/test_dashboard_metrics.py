"""Every PromQL expression the chart ships (the Grafana dashboard's, the alert rules') reads metrics that
a real gateway and a real worker export: ``dllm serve`` of the shipped model, one request through the
official client, then both /metrics scraped; the latency histograms observed that request; and every alert
rule, evaluated by promtool on series those scrapes hold, fires when it should and only then."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from engine_pod.serve.redis_server import free_port
from tests.alert_cases import Exported, alert_cases
from tests.charts.test_chart import CHART, render
from tests.promql_names import dashboard_expressions, metric_names, missing
from tests.promtool_tool import promtool
from tests.serving.serve_process import openai_client, running
from tests.serving_utils import wait_for

VALUES = CHART / "values.yaml"
LATENCY = (
    "dllm_queue_wait_seconds",
    "dllm_time_to_first_block_seconds",
    "dllm_time_per_output_token_seconds",
    "dllm_request_e2e_seconds",
)


def shipped_expressions() -> dict[str, str]:
    """Each expression the chart renders, by where it is (the dashboard's panel or variable, the alert)."""
    documents = render("monitoring.prometheusRule.enabled=true")
    dashboard = next(d for d in documents if d["kind"] == "ConfigMap" and "dllm-serving.json" in d["data"])
    found = {
        f"dashboard #{i}": e
        for i, e in enumerate(dashboard_expressions(json.loads(dashboard["data"]["dllm-serving.json"])))
    }
    rules = next(d for d in documents if d["kind"] == "PrometheusRule")
    for group in rules["spec"]["groups"]:
        found |= {f"alert {rule['alert']}": rule["expr"] for rule in group["rules"]}
    return found


def scrape(url: str) -> dict[str, list]:
    """Family name -> its samples; a sample's own name (X_bucket, X_total) -> those samples too."""
    families: dict[str, list] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        families[family.name] = list(family.samples)
        for sample in family.samples:
            if sample.name != family.name:
                families.setdefault(sample.name, []).append(sample)
    return families


def run_batch(server, lines: int) -> None:
    """A batch of ``lines`` completions, run to its end (its lines wait in the batch lane)."""
    client = openai_client(server)
    body = {"model": "tiny-llada", "prompt": "count to 5 .", "max_tokens": 16}
    content = "".join(
        json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions", "body": body})
        + "\n"
        for i in range(lines)
    )
    uploaded = client.files.create(file=("in.jsonl", content.encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    done = wait_for(
        lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b,
        120,
        what="the batch to end",
    )
    assert done.status == "completed" and done.request_counts.completed == lines


def count_of(families: dict, name: str, model: str, lane: str) -> float:
    return sum(
        s.value for s in families.get(f"{name}_count", []) if s.labels == {"model": model, "lane": lane}
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    port = free_port()
    with running(tmp_path_factory.mktemp("metrics"), "--metrics-port", str(port)) as server:
        reply = openai_client(server).completions.create(
            model="tiny-llada", prompt="count from 1 to 40 .", max_tokens=96
        )
        assert reply.choices[0].text is not None
        run_batch(server, lines=3)
        yield scrape(f"{server.url}/metrics"), scrape(f"http://127.0.0.1:{port}/metrics")


def test_every_shipped_expression_reads_exported_metrics(served):
    gateway, worker = served
    exported = set(gateway) | set(worker)
    expressions = shipped_expressions()
    assert len(expressions) >= 20
    unknown = {where: missing(metric_names(expr), exported) for where, expr in expressions.items()}
    assert {where: names for where, names in unknown.items() if names} == {}
    read = set().union(*(metric_names(expr) for expr in expressions.values()))
    for family in LATENCY:  # each latency histogram is on the dashboard
        assert f"{family}_bucket" in read
    typo = 'histogram_quantile(0.95, sum by (le) (rate(dllm_queue_wait_second_bucket{lane="batch"}[5m])))'
    assert missing(metric_names(typo), exported) == {"dllm_queue_wait_second_bucket"}


def test_the_request_is_observed_once_where_its_latency_is_known(served):
    gateway, worker = served
    # the worker: its wait, its first block; the gateway: what its client saw end to end
    for name in ("dllm_queue_wait_seconds", "dllm_time_to_first_block_seconds"):
        assert count_of(worker, name, "tiny-llada", "interactive") == 1, name
        assert f"{name}_count" not in gateway
    assert count_of(gateway, "dllm_request_e2e_seconds", "tiny-llada", "interactive") == 1
    assert count_of(worker, "dllm_request_e2e_seconds", "tiny-llada", "interactive") == 0  # batch lines only
    # a batch's lines: their wait and first block in the batch lane, end to end by the worker (their
    # client, the batch, sees no single line's answer), never by the gateway
    for name in ("dllm_queue_wait_seconds", "dllm_time_to_first_block_seconds", "dllm_request_e2e_seconds"):
        assert count_of(worker, name, "tiny-llada", "batch") == 3, name
    assert count_of(gateway, "dllm_request_e2e_seconds", "tiny-llada", "batch") == 0
    # series exist before their first observation (a panel or an alert sees zero, not nothing): answers of
    # one block have no time per output token after the first block
    per_token = worker["dllm_time_per_output_token_seconds_count"]
    assert {s.labels["lane"] for s in per_token} == {"interactive", "batch"}
    assert {s.labels["model"] for s in worker["dllm_queue_wait_seconds_count"]} == {"tiny-llada"}
    assert {s.labels["lane"] for s in gateway["dllm_request_e2e_seconds_count"]} == {"interactive"}
    labels = {tuple(sorted(s.labels)) for name in LATENCY for s in worker.get(f"{name}_count", [])}
    assert labels == {("lane", "model")}  # no tenant, request or worker ids


def test_every_alert_rule_fires_when_it_should_and_only_then(served, tmp_path):
    """``promtool test rules`` on the rendered rules, with input series taken from the real scrapes: a
    case where each alert fires and one where it stays silent (a tenant at its own limits pages no one; a
    queue with no engine scraped at all does)."""
    groups = next(
        d for d in render("monitoring.prometheusRule.enabled=true") if d["kind"] == "PrometheusRule"
    )
    groups = groups["spec"]["groups"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    checked = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the conditions under test, without the annotations (their text holds each evaluation's value)
    bare = [
        g | {"rules": [{k: v for k, v in rule.items() if k != "annotations"} for rule in g["rules"]]}
        for g in groups
    ]
    (tmp_path / "conditions.yaml").write_text(yaml.safe_dump({"groups": bare}))
    severity = {rule["alert"]: rule["labels"]["severity"] for g in groups for rule in g["rules"]}
    thresholds = yaml.safe_load(VALUES.read_text())["monitoring"]["prometheusRule"]["thresholds"]
    cases = alert_cases(Exported.of(*served), thresholds, severity)
    tested = {
        (c["alert_rule_test"][0]["alertname"], bool(c["alert_rule_test"][0]["exp_alerts"])) for c in cases
    }
    assert tested == {(alert, fires) for alert in severity for fires in (True, False)}
    document = {"rule_files": ["conditions.yaml"], "evaluation_interval": "1m", "tests": cases}
    (tmp_path / "alerts-test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    done = promtool("test", "rules", "alerts-test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
