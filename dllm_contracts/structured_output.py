"""Structured outputs from the API to the sampler (no torch): the grammar a request's answer must be in.

The gateway turns ``response_format`` (JSON mode, a JSON schema) and ``tools`` with ``tool_choice`` into
one grammar in llguidance's Lark syntax, checks it, and queues it with the request (``ResponseGrammar``);
the worker compiles it for its tokenizer and the engine keeps every finished answer in it
(engine_pod/decoding/grammar/). The JSON layout every answer takes (one space after ``,`` and ``:``, no
other whitespace) and the tool-call format are defined here, where both sides read them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# JSON as answers write it: json.dumps' default separators, no other whitespace (a model is never
# free to write whitespace without end between tokens)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# a tool call in an answer: <tool_call>{"name": NAME, "arguments": {...}}</tool_call>, one after another
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
KINDS = ("json_object", "json_schema", "tool_calls")
# the largest schema a request may ask for (a response format's, or all its tools' parameters together):
# what bounds the time a grammar takes to compile, in the gateway's check and in the worker
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_NODES = 1000  # subschemas
MAX_SCHEMA_DEPTH = 32  # objects and arrays nested in the schema's JSON


@dataclass(frozen=True)
class ResponseGrammar:
    """The grammar a request's answer is generated in (llguidance's Lark syntax) and what asked for it."""

    grammar: str
    kind: str  # one of KINDS

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown response grammar kind {self.kind!r}; choose one of {KINDS}")
        if not self.grammar:
            raise ValueError("a response grammar needs its grammar")

    def to_wire(self) -> dict[str, str]:
        return {"grammar": self.grammar, "kind": self.kind}

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> ResponseGrammar | None:
        return cls(str(data["grammar"]), str(data["kind"])) if data else None


def json_rule(schema: dict[str, Any] | bool) -> str:
    """A Lark expression for one JSON value of ``schema`` in ``JSON_LAYOUT`` (``True``: any JSON)."""
    body = {"x-guidance": JSON_LAYOUT} | (schema if isinstance(schema, dict) else {})
    return "%json " + json.dumps(body, separators=(",", ":"), sort_keys=False)


def json_grammar(schema: dict[str, Any]) -> str:
    """The grammar of an answer that is one JSON value of ``schema``."""
    return f"start: {json_rule(schema)}\n"


def tool_call_schema(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The JSON of one call of function ``name`` whose arguments follow ``parameters``."""
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_calls_grammar(functions: dict[str, dict[str, Any]], choice: str, parallel: bool) -> str:
    """The grammar of an answer to a request with tools: ``functions`` maps each callable function's name
    to its parameters schema; ``choice`` is ``required`` (one call or more: only one unless ``parallel``),
    ``auto`` (text that does not start with a call, or calls) or the one function's name (one call of it)."""
    calls = [
        f'call_{i}: "{TOOL_CALL_OPEN}" {json_rule(tool_call_schema(name, parameters))} "{TOOL_CALL_CLOSE}"'
        for i, (name, parameters) in enumerate(functions.items())
    ]
    call = "call: " + " | ".join(f"call_{i}" for i in range(len(functions)))
    repeat = "call+" if parallel else "call"
    if choice == "auto":
        start = f"start: TEXT | {repeat}\nTEXT: /(?s:.*)/ & ~/{_lark_literal(TOOL_CALL_OPEN)}(?s:.*)/"
    else:
        start = f"start: {repeat}"
    return "\n".join([start, call, *calls]) + "\n"


def call_text(name: str, arguments: str) -> str:
    """One tool call as an answer writes it (``arguments``: its JSON object, as text)."""
    return f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{TOOL_CALL_CLOSE}'


def _lark_literal(text: str) -> str:
    """``text`` as a literal inside a Lark /regex/."""
    special = set(r".^$*+?()[]{}|\/")
    return "".join("\\" + c if c in special else c for c in text)
