"""LeaderWorkerSet's own schema, to validate the LeaderWorkerSets the operator renders.

The schema is the openAPIV3Schema of kubernetes-sigs/lws's CRD (v0.10.0,
config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml; descriptions removed), a data file kept
outside the repository: $DLLM_LWS_SCHEMA, else shared/lws/leaderworkersets-v1-openapi.json in this checkout
or beside it. Its pod templates are checked as Pods by kubernetes-validate too (strict: a CRD's embedded
pod schema would prune an unknown field silently)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = Path("shared") / "lws" / "leaderworkersets-v1-openapi.json"
K8S_VERSION = "1.33.0"


def schema_path() -> Path | None:
    candidates = [Path(os.environ["DLLM_LWS_SCHEMA"])] if os.environ.get("DLLM_LWS_SCHEMA") else []
    candidates += [ROOT / SCHEMA_FILE, ROOT.parent / SCHEMA_FILE]
    return next((path for path in candidates if path.is_file()), None)


def _strict(schema: Any) -> Any:
    """The OpenAPI schema as JSON Schema that refuses unknown fields where the API server would prune
    them (an object with properties and no x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        converted.setdefault("additionalProperties", False)
    return converted


def validate_group_set(manifest: dict[str, Any]) -> None:
    """The LeaderWorkerSet against LWS's schema, and each of its pod templates as a strict Pod."""
    path = schema_path()
    if path is None:
        pytest.skip(f"LeaderWorkerSet's schema is not here (set DLLM_LWS_SCHEMA, or put it at {SCHEMA_FILE})")
    schema = _strict(json.loads(path.read_text())["openAPIV3Schema"])
    errors = [
        f"{list(e.absolute_path)}: {e.message}"
        for e in jsonschema.Draft4Validator(schema).iter_errors(manifest)
    ]
    assert not errors, errors
    group = manifest["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        template = group[role]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"engine-{role}", **template["metadata"]},
            "spec": template["spec"],
        }
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
