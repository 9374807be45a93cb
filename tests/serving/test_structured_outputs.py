"""Structured outputs and tool calls through ``dllm serve`` with the official client, on random weights
(only the grammar makes their answers valid): JSON schemas (every answer that stops validates, a cut one
says ``length``), JSON mode, tool calls with ``required``, a named function and ``auto``, streamed deltas
that reassemble to the whole answer, a Batch API line, and bad input answered with a 400 in OpenAI's
error shape. The 200-request run over every family: tests/serving/test_structured_outputs_load.py."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from engine_pod.bench.structured_schemas import SCHEMAS
from tests.serving.serve_process import openai_client, running
from tests.serving_utils import wait_for

ASK = [{"role": "user", "content": "answer as json"}]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMAS["weather_args"][0]}},
    {"type": "function", "function": {"name": "lookup", "parameters": SCHEMAS["person"][0]}},
]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running(tmp_path_factory.mktemp("structured"), "--model", "random:llada-tiny") as serve:
        yield serve


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def _model(client) -> str:
    return client.models.list().data[0].id


def _schema_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name][0], "strict": True}}


def test_json_schema_answers_validate_and_a_cut_one_says_length(client):
    model, names = _model(client), ["person", "nested", "order", "shape", "event", "refs", "color", "tags"]

    def ask(name: str, seed: int | None):
        sampled = {} if seed is None else {"temperature": 0.8, "seed": seed}
        reply = client.chat.completions.create(
            model=model, messages=ASK, max_tokens=96, response_format=_schema_format(name), **sampled
        )
        return name, reply.choices[0]

    with ThreadPoolExecutor(8) as pool:  # together: constrained rows share the engine's cycles
        answers = list(
            pool.map(lambda args: ask(*args), [(n, None) for n in names] + [(n, 7) for n in names])
        )
    stopped = 0
    for name, choice in answers:
        assert choice.finish_reason in ("stop", "length"), choice
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name][0])
            stopped += 1
    assert stopped >= len(answers) // 2
    short = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=4, response_format=_schema_format("nested")
    )
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 4


def test_json_mode_answers_parse_as_objects(client):
    model = _model(client)
    for seed in range(4):
        choice = client.chat.completions.create(
            model=model,
            messages=ASK,
            max_tokens=64,
            seed=seed,
            temperature=1.0,
            response_format={"type": "json_object"},
        ).choices[0]
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
        else:
            assert choice.finish_reason == "length" and choice.message.content.startswith("{")


def _call(client, choice, stream: bool = False, **more):
    return client.chat.completions.create(
        model=_model(client),
        messages=[{"role": "user", "content": "what is the weather in oslo?"}],
        max_tokens=96,
        tools=TOOLS,
        tool_choice=choice,
        temperature=0.7,
        seed=3,
        stream=stream,
        **more,
    )


def _reassembled(stream) -> tuple[str | None, list[tuple[str, str]], str]:
    content, calls, reason = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += (call.function.name or "") if call.function else ""
            entry["arguments"] += (call.function.arguments or "") if call.function else ""
        reason = chunk.choices[0].finish_reason or reason
    ordered = [(entry["name"], entry["arguments"]) for _, entry in sorted(calls.items())]
    return content or None, ordered, reason


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "lookup"}}, "auto"], ids=str
)
def test_tool_calls_are_valid_and_a_stream_reassembles_to_the_whole_answer(client, choice):
    whole = _call(client, choice).choices[0]
    calls = [(call.function.name, call.function.arguments) for call in whole.message.tool_calls or []]
    if choice != "auto":
        assert whole.finish_reason in ("tool_calls", "length")
    if whole.finish_reason == "tool_calls":
        assert calls and whole.message.content is None
        for name, arguments in calls:
            assert name in PARAMETERS if choice == "required" else name == "lookup"
            jsonschema.validate(json.loads(arguments), PARAMETERS[name])
        assert len({call.id for call in whole.message.tool_calls}) == len(calls)
    elif whole.finish_reason == "stop":  # auto: content
        assert not calls and isinstance(whole.message.content, str)
    assert _reassembled(_call(client, choice, stream=True)) == (
        whole.message.content,
        calls,
        whole.finish_reason,
    )


def test_one_call_at_most_without_parallel_tool_calls(client):
    choice = _call(client, "required", parallel_tool_calls=False).choices[0]
    assert len(choice.message.tool_calls or []) <= 1


@pytest.mark.parametrize(
    "fields, param, code, named",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "foo"}},
                }
            },
            "response_format.json_schema.schema",
            "invalid_value",
            "not a valid JSON Schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
                }
            },
            "response_format.json_schema.schema",
            "unsupported_schema_keyword",
            "'uniqueItems'",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            "tools[0].function.parameters",
            "missing",
            "parameters schema",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nowhere"}}},
            "tool_choice",
            "invalid_value",
            "'nowhere'",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "big",
                        "schema": {
                            "type": "object",
                            "properties": {f"p{i}": {"type": "integer"} for i in range(1200)},
                        },
                    },
                }
            },
            "response_format.json_schema.schema",
            "schema_too_large",
            "too large to compile",
        ),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value", "needs tools"),
    ],
    ids=[
        "invalid-schema",
        "unsupported-keyword",
        "tool-without-parameters",
        "unknown-function",
        "too-large",
        "choice-without-tools",
    ],
)
def test_bad_input_is_a_400_in_openais_shape(client, server, fields, param, code, named):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=_model(client), messages=ASK, **fields)
    error = refused.value.body
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code), error
    assert named in error["message"]


def test_a_batch_line_answers_with_tool_calls_and_a_schema_line_validates(client):
    model = _model(client)
    lines = [
        {
            "custom_id": "calls",
            "body": {"tools": TOOLS, "tool_choice": "required", "seed": 1, "temperature": 0.7},
        },
        {"custom_id": "json", "body": {"response_format": _schema_format("person")}},
    ]
    for line in lines:
        line |= {"method": "POST", "url": "/v1/chat/completions"}
        line["body"] |= {"model": model, "messages": ASK, "max_tokens": 96}
    upload = client.files.create(
        file=("batch.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_for(
        lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b, 120, 0.2
    )
    assert done.status == "completed"
    output = {
        row["custom_id"]: row["response"]["body"]["choices"][0]
        for row in map(json.loads, client.files.content(done.output_file_id).text.splitlines())
    }
    if output["calls"]["finish_reason"] == "tool_calls":
        for call in output["calls"]["message"]["tool_calls"]:
            jsonschema.validate(
                json.loads(call["function"]["arguments"]), PARAMETERS[call["function"]["name"]]
            )
    if output["json"]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(output["json"]["message"]["content"]), SCHEMAS["person"][0])
    assert {output["calls"]["finish_reason"], output["json"]["finish_reason"]} <= {
        "tool_calls",
        "stop",
        "length",
    }
