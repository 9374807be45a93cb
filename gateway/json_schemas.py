"""The JSON Schema subset structured outputs accept (docs/api.md#structured-outputs), checked before a
schema is compiled: a keyword outside it is refused by name and place, a schema that is not valid JSON
Schema is refused with the validator's reason, and a schema larger than the service compiles is refused
with the bound."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from dllm_contracts.structured_output import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES

# what each keyword holds: subschemas by name, a list of subschemas, one subschema (or a boolean), data
_SCHEMA_MAPS = {"properties", "$defs", "definitions"}
_SCHEMA_LISTS = {"anyOf", "allOf", "prefixItems"}
_SCHEMA_ONE = {"items", "additionalProperties"}
_ASSERTIONS = {
    "type",
    "required",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "$ref",
    "pattern",
    "format",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minProperties",
    "maxProperties",
}
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment"}
_ANNOTATIONS |= {"deprecated", "readOnly", "writeOnly"}
SUPPORTED = _SCHEMA_MAPS | _SCHEMA_LISTS | _SCHEMA_ONE | _ASSERTIONS | _ANNOTATIONS


class SchemaProblem(ValueError):
    """Why a schema cannot be used, in one line; ``code``: the API error code it is answered with."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def check_schema(schema: Any, what: str) -> None:
    """``schema`` is valid JSON Schema (2020-12), within the size bound and the supported subset; else
    SchemaProblem naming ``what`` (how the request calls it) and, for a keyword, where it is."""
    if not isinstance(schema, dict):
        raise SchemaProblem(f"{what} must be a JSON Schema object", "invalid_value")
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaProblem(
            f"{what} is too large to compile: {size} bytes, this service compiles at most {MAX_SCHEMA_BYTES}",
            "schema_too_large",
        )
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaProblem(
            f"{what} is too large to compile: nested {depth} levels deep, this service compiles at most "
            f"{MAX_SCHEMA_DEPTH}",
            "schema_too_large",
        )
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = _pointer(exc.path)
        raise SchemaProblem(
            f"{what} is not a valid JSON Schema: {exc.message} (at {where})", "invalid_value"
        ) from None
    nodes = _walk(schema, "#", what)
    if nodes > MAX_SCHEMA_NODES:
        raise SchemaProblem(
            f"{what} is too large to compile: {nodes} subschemas, this service compiles at most "
            f"{MAX_SCHEMA_NODES}",
            "schema_too_large",
        )


def _walk(schema: Any, where: str, what: str) -> int:
    """The subschemas in ``schema`` (itself included); SchemaProblem at the first unsupported keyword."""
    if isinstance(schema, bool):
        return 1
    count = 1
    for keyword, value in schema.items():
        if keyword not in SUPPORTED:
            raise SchemaProblem(
                f"{what}: the keyword {keyword!r} (at {where}) is not supported; supported keywords: "
                "docs/api.md#structured-outputs",
                "unsupported_schema_keyword",
            )
        place = f"{where}/{keyword}"
        if keyword in _SCHEMA_MAPS:
            count += sum(_walk(sub, f"{place}/{name}", what) for name, sub in value.items())
        elif keyword in _SCHEMA_LISTS:
            count += sum(_walk(sub, f"{place}/{i}", what) for i, sub in enumerate(value))
        elif keyword in _SCHEMA_ONE:
            count += _walk(value, place, what)
    return count


def _depth(value: Any) -> int:
    """How deeply ``value``'s objects and arrays nest (without recursion: any depth is measured)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _pointer(path) -> str:
    return "#" + "".join(f"/{part}" for part in path)
