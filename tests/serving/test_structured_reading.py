"""The gateway's side of structured outputs without a server: an answer's calls read from any prefix of it
(so a stream's pieces add up to the whole answer's calls, character for character), the grammars built
from a request, and the JSON Schema subset's refusals (a keyword named with its place, a bound named)."""

from __future__ import annotations

import json

import pytest

from dllm_contracts.structured_output import call_text
from gateway.errors import ApiError
from gateway.json_schemas import SchemaProblem, check_schema
from gateway.response_grammar import response_grammar
from gateway.schemas import ChatCompletionRequest
from gateway.tool_calls import CallStream, is_calls, read_calls

ANSWER = call_text("get_weather", '{"city": "a \\"}\\" b", "days": [1, {"x": 2}]}') + call_text(
    "lookup", "{}"
)


def test_calls_are_read_whole_and_their_arguments_are_the_answers_text():
    calls = read_calls(ANSWER)
    assert [(c.name, c.complete) for c in calls] == [("get_weather", True), ("lookup", True)]
    assert json.loads(calls[0].arguments) == {"city": 'a "}" b', "days": [1, {"x": 2}]}
    assert calls[1].arguments == "{}"


def test_every_prefix_streams_pieces_that_add_up_to_the_whole_calls():
    stream, pieces = CallStream("chatcmpl-1"), {}
    for end in range(len(ANSWER) + 1):
        for delta in stream.deltas(ANSWER[:end]):
            entry = pieces.setdefault(delta["index"], {"name": "", "arguments": ""})
            entry["name"] += delta["function"].get("name", "")
            entry["arguments"] += delta["function"]["arguments"]
    whole = [(c.name, c.arguments) for c in read_calls(ANSWER)]
    assert [(e["name"], e["arguments"]) for _, e in sorted(pieces.items())] == whole


def test_an_answer_is_calls_only_when_it_starts_with_one():
    assert is_calls(ANSWER) is True
    assert is_calls("<tool") is None  # too short to tell
    assert is_calls("hello <tool_call>") is False


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_a_request_becomes_one_grammar_or_none():
    assert response_grammar(_chat()) is None
    assert response_grammar(_chat(response_format={"type": "json_object"})).kind == "json_object"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert response_grammar(_chat(tools=tools, tool_choice="none")) is None
    assert "TEXT" in response_grammar(_chat(tools=tools)).grammar  # auto: content or calls
    assert "call+" not in response_grammar(_chat(tools=tools, parallel_tool_calls=False)).grammar
    with pytest.raises(ApiError, match="together"):
        response_grammar(_chat(tools=tools, response_format={"type": "json_object"}))


@pytest.mark.parametrize(
    "schema, code, named",
    [
        (
            {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
            "unsupported_schema_keyword",
            "#/properties/a",
        ),
        ({"type": "string", "minLength": "x"}, "invalid_value", "#/minLength"),
        ({"type": "array", "default": _nested(40)}, "schema_too_large", "nested"),
        (
            {"type": "object", "properties": {str(i): {"type": "integer"} for i in range(1001)}},
            "schema_too_large",
            "1002 subschemas",
        ),
        ("not a schema", "invalid_value", "JSON Schema object"),
    ],
)
def test_a_schema_outside_the_subset_or_its_bounds_is_refused_by_name(schema, code, named):
    with pytest.raises(SchemaProblem) as refused:
        check_schema(schema, "the schema")
    assert refused.value.code == code and named in str(refused.value)
