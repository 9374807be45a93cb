"""JSON schemas that exercise the keywords structured outputs support, each with an instance that
validates: the structured-output tests and the grammar-engine benchmark draw from them.

Between them: nested objects, arrays with item bounds, enums, integers and numbers with ranges, strings
with patterns and lengths, optional and required fields, ``anyOf``, ``const``, ``$defs``/``$ref``, nullable
types and formats. Strings carry a ``maxLength`` where a random model would otherwise write without end."""

from __future__ import annotations

from typing import Any

_NAME = {"type": "string", "minLength": 1, "maxLength": 12}

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "person": (
        {
            "type": "object",
            "properties": {"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        {"name": "alice", "age": 42},
    ),
    "address": (
        {
            "type": "object",
            "properties": {
                "street": _NAME,
                "city": _NAME,
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
        {"street": "main", "city": "paris", "zip": "75001"},
    ),
    "nested": (
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                        "profile": {
                            "type": "object",
                            "properties": {"nick": _NAME, "active": {"type": "boolean"}},
                            "required": ["nick", "active"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["id", "profile"],
                    "additionalProperties": False,
                }
            },
            "required": ["user"],
            "additionalProperties": False,
        },
        {"user": {"id": 7, "profile": {"nick": "bo", "active": True}}},
    ),
    "tags": (
        {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 4},
        ["red", "blue"],
    ),
    "color": ({"type": "string", "enum": ["red", "green", "blue"]}, "green"),
    "enum_object": (
        {
            "type": "object",
            "properties": {
                "status": {"enum": ["open", "closed", "pending"]},
                "priority": {"type": "integer", "enum": [1, 2, 3]},
            },
            "required": ["status", "priority"],
            "additionalProperties": False,
        },
        {"status": "open", "priority": 2},
    ),
    "score": ({"type": "integer", "minimum": -50, "maximum": 50}, 17),
    "measure": (
        {
            "type": "object",
            "properties": {
                "value": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                "ratio": {"type": "number", "minimum": -1, "maximum": 1},
            },
            "required": ["value", "ratio"],
            "additionalProperties": False,
        },
        {"value": 12.5, "ratio": -0.25},
    ),
    "code": (
        {
            "type": "object",
            "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
            "required": ["code"],
            "additionalProperties": False,
        },
        {"code": "ABC-12"},
    ),
    "lengths": (
        {
            "type": "object",
            "properties": {
                "short": {"type": "string", "minLength": 2, "maxLength": 4},
                "word": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 10},
            },
            "required": ["short", "word"],
            "additionalProperties": False,
        },
        {"short": "abc", "word": "hello"},
    ),
    "optional": (
        {
            "type": "object",
            "properties": {"title": _NAME, "subtitle": _NAME, "pages": {"type": "integer", "minimum": 1}},
            "required": ["title"],
            "additionalProperties": False,
        },
        {"title": "dune", "pages": 412},
    ),
    "id_any": ({"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "maxLength": 6}]}, "x12"),
    "shape": (
        {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0}},
                    "required": ["kind", "radius"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "square"},
                        "side": {"type": "integer", "minimum": 1, "maximum": 100},
                    },
                    "required": ["kind", "side"],
                    "additionalProperties": False,
                },
            ]
        },
        {"kind": "square", "side": 3},
    ),
    "order": (
        {
            "type": "object",
            "properties": {
                "lines": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z0-9]{4}$"},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                        },
                        "required": ["sku", "qty"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["lines"],
            "additionalProperties": False,
        },
        {"lines": [{"sku": "AB12", "qty": 2}]},
    ),
    "flags": (
        {
            "type": "object",
            "properties": {"on": {"type": "boolean"}, "none": {"type": "null"}},
            "required": ["on", "none"],
            "additionalProperties": False,
        },
        {"on": False, "none": None},
    ),
    "versioned": (
        {
            "type": "object",
            "properties": {"version": {"const": 2}, "name": _NAME},
            "required": ["version", "name"],
            "additionalProperties": False,
        },
        {"version": 2, "name": "v"},
    ),
    "refs": (
        {
            "$defs": {
                "point": {
                    "type": "object",
                    "properties": {
                        "x": {"type": "integer", "minimum": -9, "maximum": 9},
                        "y": {"type": "integer", "minimum": -9, "maximum": 9},
                    },
                    "required": ["x", "y"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
            "required": ["start", "end"],
            "additionalProperties": False,
        },
        {"start": {"x": 1, "y": -2}, "end": {"x": 0, "y": 9}},
    ),
    "matrix": (
        {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {
                "type": "array",
                "minItems": 2,
                "maxItems": 2,
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
            },
        },
        [[1, 2], [3, 4]],
    ),
    "nullable": (
        {
            "type": "object",
            "properties": {"note": {"type": ["string", "null"], "maxLength": 8}},
            "required": ["note"],
            "additionalProperties": False,
        },
        {"note": None},
    ),
    "event": (
        {
            "type": "object",
            "properties": {
                "day": {"type": "string", "format": "date"},
                "kind": {"type": "string", "enum": ["talk", "lunch"]},
            },
            "required": ["day", "kind"],
            "additionalProperties": False,
        },
        {"day": "2024-05-01", "kind": "talk"},
    ),
    "deep": (
        {
            "type": "object",
            "properties": {
                "a": {
                    "type": "object",
                    "properties": {
                        "b": {
                            "type": "object",
                            "properties": {
                                "c": {"type": "array", "maxItems": 2, "items": {"type": "boolean"}}
                            },
                            "required": ["c"],
                            "additionalProperties": False,
                        }
                    },
                    "required": ["b"],
                    "additionalProperties": False,
                }
            },
            "required": ["a"],
            "additionalProperties": False,
        },
        {"a": {"b": {"c": [True]}}},
    ),
    "weather_args": (
        {
            "type": "object",
            "properties": {
                "city": _NAME,
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        {"city": "oslo", "unit": "celsius"},
    ),
}
