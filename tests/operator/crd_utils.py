"""The CRD as the API server would use it: structural defaulting, schema validation, CEL rules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "dllmservices.dllm.dev.yaml"
EXAMPLE_PATH = ROOT / "crds" / "example-dllmservice.yaml"


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting: fill absent fields that have a default, recursively."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        return value
    result = copy.deepcopy(value)
    for key, sub in (schema.get("properties") or {}).items():
        if key not in result and "default" in sub:
            result[key] = copy.deepcopy(sub["default"])
        if key in result:
            result[key] = apply_defaults(result[key], sub)
    return result


def _openapi_to_jsonschema(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _openapi_to_jsonschema(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if isinstance(schema, list):
        return [_openapi_to_jsonschema(v) for v in schema]
    return schema


def schema_errors(spec: dict[str, Any], crd: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(_openapi_to_jsonschema(spec_schema(crd)))
    return [error.message for error in validator.iter_errors(spec)]


def cel_failures(spec: dict[str, Any], crd: dict[str, Any]) -> list[str]:
    """Messages of the CEL rules the (defaulted) spec violates, at every level of the schema."""
    environment = celpy.Environment()
    failures: list[str] = []

    def visit(value: Any, schema: dict[str, Any]) -> None:
        for rule in schema.get("x-kubernetes-validations") or []:
            program = environment.program(environment.compile(rule["rule"]))
            if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
                failures.append(rule["message"])
        if isinstance(value, dict):
            for key, sub in (schema.get("properties") or {}).items():
                if key in value:
                    visit(value[key], sub)

    visit(spec, spec_schema(crd))
    return failures


def admit(spec: dict[str, Any], crd: dict[str, Any] | None = None) -> list[str]:
    """What the API server would say: schema errors, then CEL failures, of the defaulted spec."""
    crd = crd or load_crd()
    defaulted = apply_defaults(spec, spec_schema(crd))
    return schema_errors(defaulted, crd) or cel_failures(defaulted, crd)
