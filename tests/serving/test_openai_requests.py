"""Requests and answers as OpenAI defines them, through ``dllm serve`` with the official client (sync and
async): content parts, fields we do not implement refused by name, unknown fields, at most four stops, no
coercion, body and prompt limits, ``chatcmpl-`` ids, usage cut at a stop, log probability tokens that
are the text's pieces, and OpenAI's error codes."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.serving.conftest import KEY, SERVED
from tests.serving.serve_process import openai_client

ASK = "letters from t to z ."  # the shipped model answers "t u v w x y z"
HEADERS = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}


@pytest.fixture
def client(keyed_serve):
    return openai_client(keyed_serve, KEY)


def _chat(client, **extra):
    messages = extra.pop("messages", [{"role": "user", "content": ASK}])
    return client.chat.completions.create(model=SERVED, messages=messages, max_tokens=16, **extra)


def _refused(call, param: str, code: str | None) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as refused:
        call()
    error = refused.value.body
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error
    return refused.value


def test_content_as_text_parts_is_read_as_the_joined_text(client):
    plain = _chat(client).choices[0].message.content
    parts = [{"type": "text", "text": "letters from t"}, {"type": "text", "text": "to z ."}]
    joined = _chat(client, messages=[{"role": "user", "content": "letters from t\nto z ."}])
    assert _chat(client, messages=[{"role": "user", "content": parts}]).choices[0].message.content == (
        joined.choices[0].message.content
    )
    one_part = [{"type": "text", "text": ASK}]
    assert _chat(client, messages=[{"role": "user", "content": one_part}]).choices[0].message.content == plain


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-x"}},
    ],
)
def test_an_image_audio_or_file_part_is_refused_naming_what_is_not_supported(client, part):
    content = [{"type": "text", "text": ASK}, part]
    refused = _refused(
        lambda: _chat(client, messages=[{"role": "user", "content": content}]),
        "messages[0].content",
        "unsupported_value",
    )
    assert part["type"] in refused.body["message"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("functions", [{"name": "f", "parameters": {}}]),
        ("function_call", "auto"),
        ("logit_bias", {"5": 10}),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -1.0),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("reasoning_effort", "low"),
        ("store", True),
        ("service_tier", "flex"),
    ],
)
def test_a_field_openai_defines_and_we_do_not_implement_is_a_400_naming_it(client, field, value):
    _refused(lambda: _chat(client, extra_body={field: value}), field, "unsupported_parameter")


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": []},
        {"tool_choice": "none"},
        {"parallel_tool_calls": True},
        {"response_format": {"type": "text"}},
        {"logit_bias": {}},
        {"presence_penalty": 0, "frequency_penalty": 0.0},
        {"store": False},
        {"service_tier": "auto"},
        {"metadata": {"team": "a"}},
        {"user": "someone"},
    ],
)
def test_a_value_that_does_nothing_by_openais_definition_is_accepted(client, extra):
    assert (
        _chat(client, extra_body=extra).choices[0].message.content == _chat(client).choices[0].message.content
    )


def test_structured_outputs_on_a_model_whose_tokenizer_cannot_write_json_are_a_400_saying_why(client):
    """The shipped model's word-level tokenizer has no braces or quotes: no answer could be in a grammar."""
    for fields in (
        {"response_format": {"type": "json_object"}},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            _chat(client, **fields)
        assert "tokenizer that can write any text" in refused.value.body["message"]


def test_completions_refuse_best_of_suffix_and_penalties(client):
    for field, value in (("best_of", 2), ("suffix", "!"), ("logit_bias", {"3": 1})):
        _refused(
            lambda f=field, v=value: client.completions.create(
                model=SERVED, prompt=ASK, max_tokens=8, extra_body={f: v}
            ),
            field,
            "unsupported_parameter",
        )
    assert client.completions.create(model=SERVED, prompt=ASK, max_tokens=8, best_of=1).choices


def test_unknown_fields_are_refused_at_any_depth(client):
    _refused(lambda: _chat(client, extra_body={"foo": 1}), "foo", "unknown_parameter")
    messages = [{"role": "user", "content": ASK, "mood": "happy"}]
    _refused(lambda: _chat(client, messages=messages), "messages[0].mood", "unknown_parameter")
    parts = [{"type": "text", "text": ASK, "cache_control": {"type": "ephemeral"}}]
    _refused(
        lambda: _chat(client, messages=[{"role": "user", "content": parts}]),
        "messages[0].content[0].cache_control",
        "unknown_parameter",
    )


def test_at_most_four_stop_strings_and_no_coercion(client):
    _refused(lambda: _chat(client, stop=[str(i) for i in range(5)]), "stop", "array_above_max_length")
    assert _chat(client, stop=["1", "2", "3", "4"]).choices
    coerced = [  # (body field, value, the param the error names)
        ("stream_options", {"include_usage": "yes"}, "stream_options.include_usage"),
        ("n", "2", "n"),
        ("logprobs", 1, "logprobs"),
    ]
    for field, value, param in coerced:
        _refused(
            lambda f=field, v=value: _chat(client, extra_body={f: v, "stream": True}), param, "invalid_type"
        )
    _refused(lambda: _chat(client, stream_options={"include_usage": True}), "stream_options", "invalid_value")
    _refused(lambda: _chat(client, top_logprobs=2), "top_logprobs", "invalid_value")


def test_a_stop_cuts_the_text_and_the_usage_counts_what_is_returned(client):
    whole = _chat(client)
    cut = _chat(client, stop=["w"])
    text = cut.choices[0].message.content
    assert whole.choices[0].message.content.startswith(text) and "w" not in text
    assert cut.choices[0].finish_reason == "stop"
    tokens = _chat(client, logprobs=True).choices[0].logprobs.content
    shown = next(k for k in range(len(tokens) + 1) if len("".join(t.token for t in tokens[:k])) >= len(text))
    assert cut.usage.completion_tokens == shown < whole.usage.completion_tokens
    chunks = list(_chat(client, stop=["w"], stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == cut.usage.completion_tokens


def test_ids_of_chat_answers_start_with_chatcmpl(keyed_serve, client):
    assert _chat(client).id.startswith("chatcmpl-")
    assert all(c.id.startswith("chatcmpl-") for c in _chat(client, stream=True))
    assert client.completions.create(model=SERVED, prompt=ASK, max_tokens=4).id.startswith("cmpl-")

    async def streamed_async() -> list[str]:
        async with openai_client(keyed_serve, KEY, asynchronous=True) as aclient:
            stream = await aclient.chat.completions.create(
                model=SERVED, messages=[{"role": "user", "content": ASK}], max_tokens=8, stream=True
            )
            return [chunk.id async for chunk in stream]

    assert all(i.startswith("chatcmpl-") for i in asyncio.run(streamed_async()))


def test_every_logprob_token_is_the_piece_of_text_it_describes_and_lists_itself_so(client):
    reply = _chat(client, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    assert any(t.token.startswith(" ") for t in content), "the answer has pieces with a leading space"
    for token in content:  # greedy: the committed token is among its step's likeliest, spelled the same
        assert token.token in [alternative.token for alternative in token.top_logprobs]
    completion = client.completions.create(model=SERVED, prompt=ASK, max_tokens=12, logprobs=3)
    logprobs = completion.choices[0].logprobs
    assert all(piece in top for piece, top in zip(logprobs.tokens, logprobs.top_logprobs))


@pytest.mark.parametrize(
    "call, status, param, code",
    [
        (
            lambda c: c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]),
            404,
            "model",
            "model_not_found",
        ),
        (
            lambda c: c.completions.create(model=SERVED, prompt="a " * 3000),
            400,
            "prompt",
            "context_length_exceeded",
        ),
        (
            lambda c: c.completions.create(model=SERVED, prompt=ASK, max_tokens=True),
            400,
            "max_tokens",
            "invalid_type",
        ),
        (lambda c: c.completions.create(model=SERVED, prompt=ASK, n=0), 400, "n", "integer_below_min_value"),
        (lambda c: c.models.retrieve("gpt-4o"), 404, "model", "model_not_found"),
        (
            lambda c: c.completions.create(model=SERVED, prompt=ASK, max_tokens=513),
            400,
            "max_tokens",
            "integer_above_max_value",
        ),
        (
            lambda c: c.chat.completions.create(
                model=SERVED, messages=[{"role": "user", "content": ASK}], max_completion_tokens=513
            ),
            400,
            "max_completion_tokens",
            "integer_above_max_value",
        ),
        (lambda c: c.completions.create(model=SERVED, prompt=""), 400, "prompt", "invalid_value"),
        (
            lambda c: c.completions.create(model=SERVED, prompt=[[1], [2]] * 33),
            400,
            "prompt",
            "array_above_max_length",
        ),
        (
            lambda c: c.completions.create(model=SERVED, prompt=ASK, temperature=3),
            400,
            "temperature",
            "decimal_above_max_value",
        ),
        (
            lambda c: c.chat.completions.create(model=SERVED, messages=[]),
            400,
            "messages",
            "array_below_min_length",
        ),
        (
            lambda c: c.chat.completions.create(model=SERVED, messages=[{"role": "robot", "content": "x"}]),
            400,
            "messages[0].role",
            "invalid_value",
        ),
    ],
)
def test_errors_carry_openais_code(client, call, status, param, code):
    with pytest.raises(openai.APIStatusError) as refused:
        call(client)
    assert refused.value.status_code == status
    assert (refused.value.body["param"], refused.value.body["code"]) == (param, code)


def test_a_wrong_key_has_the_invalid_api_key_code_and_metrics_need_a_key(keyed_serve):
    with pytest.raises(openai.AuthenticationError) as refused:
        openai_client(keyed_serve, "sk-wrong").models.list()
    assert refused.value.body["code"] == "invalid_api_key"
    assert httpx.get(f"{keyed_serve.url}/metrics").status_code == 401
    assert httpx.get(f"{keyed_serve.url}/metrics", headers=HEADERS).status_code == 200


def test_invalid_json_is_answered_in_words_with_no_param(keyed_serve):
    reply = httpx.post(
        f"{keyed_serve.url}/v1/completions", content=b'{"model": "x", "prompt": ', headers=HEADERS
    )
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] is None
    assert error["message"].startswith("the request body is not valid JSON") and "[" not in error["message"]


def test_a_body_over_the_limit_is_a_413_before_it_is_read_and_a_long_prompt_before_it_is_tokenized(
    keyed_serve,
):
    huge = b'{"model": "tiny-llada", "foo": "' + b"a" * 10_000_000 + b'"}'
    reply = httpx.post(f"{keyed_serve.url}/v1/completions", content=huge, headers=HEADERS, timeout=60)
    assert reply.status_code == 413 and reply.json()["error"]["type"] == "invalid_request_error"

    def chunked():  # no Content-Length: counted as it arrives
        for _ in range(20):
            yield b" " * 500_000

    reply = httpx.post(f"{keyed_serve.url}/v1/completions", content=chunked(), headers=HEADERS, timeout=60)
    assert reply.status_code == 413
    long_prompt = {"model": SERVED, "prompt": "a" * 1_000_000}
    reply = httpx.post(f"{keyed_serve.url}/v1/completions", json=long_prompt, headers=HEADERS, timeout=60)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "at least" in error["message"]  # counted from its size: refused before it was tokenized
