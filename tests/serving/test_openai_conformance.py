"""The official ``openai`` client, sync and async, against ``dllm serve`` (the shipped model): what the
API promises and how its errors look. One ``dllm serve`` for the module; each test stops nothing."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.serving.serve_process import Serve

MODEL = "tiny-llada"
LONG = "count from 1 to 21 ."  # the shipped model answers it with several blocks


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    server = Serve(tmp_path_factory.mktemp("conformance"))
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture
def client(serve):
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("max_tokens", [1, 3, 20, 40])
def test_max_tokens_is_exact(client, max_tokens):
    """A block holds 32 tokens; an answer longer than max_tokens is cut to exactly max_tokens of them
    (finish_reason length), a shorter one ends at its EOS (stop)."""
    messages = [{"role": "user", "content": LONG}]
    natural = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=128)
    natural_tokens = natural.usage.completion_tokens
    assert natural_tokens > 3, "the prompt should need more than a few tokens"
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens)
    expected = ("length", max_tokens) if natural_tokens > max_tokens else ("stop", natural_tokens)
    assert (chat.choices[0].finish_reason, chat.usage.completion_tokens) == expected
    assert natural.choices[0].message.content.startswith(chat.choices[0].message.content)
    reply = client.completions.create(model=MODEL, prompt=LONG, max_tokens=max_tokens)
    assert reply.usage.completion_tokens <= max_tokens
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_async_stream_ends_with_a_usage_chunk_and_matches_the_whole_answer(serve, client):
    async def stream() -> list:
        async with openai.AsyncOpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0) as aclient:
            chunks = await aclient.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": LONG}],
                max_tokens=10,  # the answer has about 22: the stream is cut inside its first block
                stream=True,
                stream_options={"include_usage": True},
            )
            return [chunk async for chunk in chunks]

    chunks = asyncio.run(stream())
    *text_chunks, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 10
    assert text_chunks[-1].choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].delta.content or "" for c in text_chunks)
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": LONG}], max_tokens=10
    )
    assert streamed == whole.choices[0].message.content  # greedy: the same text, cut at the same token


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_tokens": True}, "max_tokens"),  # a boolean is not 1
        ({"extra_body": {"stream": "yes"}}, "stream"),  # a string is not true
        ({"extra_body": {"threshold": 2}}, "threshold"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_an_invalid_body_is_a_400_with_openais_error_json(client, fields, param):
    arguments = {"model": MODEL, "prompt": "hi", "max_tokens": 8} | fields
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**arguments)
    assert refused.value.status_code == 400
    assert refused.value.body["type"] == "invalid_request_error"
    assert param in refused.value.body["param"]


def test_a_lone_surrogate_is_a_400_not_a_500(serve):
    """Valid JSON (an escaped surrogate), not text; the official client cannot even send it."""
    body = b'{"model": "tiny-llada", "prompt": "\\ud800", "max_tokens": 8}'
    reply = httpx.post(
        f"{serve.url}/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize("identifier", ["batch-0:results", "batch-x", "../file", "file-1"])
def test_ids_that_we_never_issued_are_404_not_500(client, identifier):
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve(identifier)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(identifier)
    with pytest.raises(openai.NotFoundError):
        client.files.content(identifier)
