"""Children's names and labels stay valid and distinct for any DLLMService name (DNS subdomains up to
253 characters, dots allowed), including names of 62 characters and more."""

from __future__ import annotations

import re

import pytest
import yaml
from dllm_operator.spec import parse_spec

from dllm_contracts.queue.keys import ServiceKeys
from tests.operator.crd_utils import EXAMPLE_PATH
from tests.operator.test_manifests import all_manifests, validate

RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
NAMES = [
    "llada-8b",
    "a" * 61,
    "a" * 62,
    "a" * 63,
    "b" * 64,
    "c" * 200 + ".example",
    "model.v2.prod",
    "9lives",
]


def _spec(name: str):
    return parse_spec(name, "default", yaml.safe_load(EXAMPLE_PATH.read_text())["spec"])


def _labels(manifest: dict) -> list[dict]:
    found = [manifest["metadata"].get("labels") or {}]
    template = manifest.get("spec", {}).get("template", {}).get("metadata", {})
    found.append(template.get("labels") or {})
    found.append(manifest.get("spec", {}).get("selector", {}).get("matchLabels") or {})
    return found


@pytest.mark.parametrize("name", NAMES, ids=lambda n: f"{n[:20]}..({len(n)})")
def test_every_child_name_and_label_is_valid_and_distinct(name):
    manifests = all_manifests(_spec(name))
    kinds_names = [(m["kind"], m["metadata"]["name"]) for m in manifests]
    assert len(set(kinds_names)) == len(kinds_names), kinds_names  # no two children collapse into one
    deployments = [n for k, n in kinds_names if k == "Deployment"]
    assert len(set(deployments)) == 3
    for manifest in manifests:
        child = manifest["metadata"]["name"]
        assert len(child) <= 63 and RFC1035.match(child), child
        for labels in _labels(manifest):
            for value in labels.values():
                assert len(value) <= 63 and LABEL_VALUE.match(value), value
        validate(manifest)
    ServiceKeys(_spec(name).queue_service)  # a valid queue name too


def test_long_names_that_share_a_prefix_get_different_children():
    first, second = "a" * 70 + "-one", "a" * 70 + "-two"
    names_first = {m["metadata"]["name"] for m in all_manifests(_spec(first))}
    names_second = {m["metadata"]["name"] for m in all_manifests(_spec(second))}
    assert not names_first & names_second
    assert _spec(first).queue_service != _spec(second).queue_service


def test_short_names_are_kept_as_they_are():
    manifests = all_manifests(_spec("llada-8b"))
    assert {m["metadata"]["name"] for m in manifests} >= {"llada-8b-engine", "llada-8b-gateway", "llada-8b"}
    assert manifests[2]["metadata"]["labels"]["app.kubernetes.io/instance"] == "llada-8b"
