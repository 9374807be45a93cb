"""The official ``openai`` client, sync and async, against ``dllm serve`` (the shipped model): what the
API promises and how its errors look. One ``dllm serve`` for the session (``keyed_serve``), with two API
keys (two tenants); each test stops nothing."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.serving.conftest import KEY, OTHER_KEY, SERVED
from tests.serving.serve_process import openai_client, running, wait_for_batch
from tests.serving_utils import write_served_model

MODEL = SERVED
LONG = "count from 1 to 21 ."  # the shipped model answers it with 22 tokens
LONGER = "count from 1 to 60 ."  # and this with 60: two blocks


@pytest.fixture
def serve(keyed_serve):
    return keyed_serve


@pytest.fixture
def client(serve):
    return openai_client(serve, KEY)


@pytest.fixture
def other(serve):
    """The other tenant."""
    return openai_client(serve, OTHER_KEY)


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
        async with openai_client(serve, KEY, asynchronous=True) as aclient:
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
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    reply = httpx.post(f"{serve.url}/v1/completions", content=body, headers=headers)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize("identifier", ["batch-0:results", "batch-x", "../file", "file-1"])
def test_ids_that_we_never_issued_are_404_not_500(client, identifier):
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve(identifier)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(identifier)
    with pytest.raises(openai.NotFoundError):
        client.files.content(identifier)


def _batch_file(lines: int) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 128}
    rows = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(lines)
    ]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def test_a_wrong_key_is_refused(serve):
    stranger = openai_client(serve, "not-a-key")
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()


def test_files_are_listed_retrieved_and_deleted_by_their_owner_only(client, other):
    uploaded = client.files.create(file=("lines.jsonl", _batch_file(2)), purpose="batch")
    assert uploaded.id in [f.id for f in client.files.list()]
    assert uploaded.id not in [f.id for f in other.files.list()]
    assert client.files.retrieve(uploaded.id).bytes == len(_batch_file(2))
    for call in (other.files.retrieve, other.files.content, other.files.delete):
        with pytest.raises(openai.NotFoundError):
            call(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert client.files.delete(uploaded.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    assert uploaded.id not in [f.id for f in client.files.list()]


def test_file_listing_pages_in_order(client):
    ids = [client.files.create(file=(f"f{i}.jsonl", _batch_file(1)), purpose="batch").id for i in range(3)]
    first = client.files.list(limit=2, order="asc")
    assert [f.id for f in first.data][:2] == sorted([f.id for f in first.data])[:2]
    newest = client.files.list(limit=2)  # newest first by default
    assert [f.id for f in newest.data] == [ids[2], ids[1]] and newest.has_more
    rest = client.files.list(limit=2, after=ids[1])
    assert rest.data[0].id == ids[0]


def test_a_batch_is_its_owners_and_cancelling_it_stops_its_queued_lines(client, other):
    lines = 2000  # far more than the worker finishes before the cancel arrives (~300 per second)
    source = client.files.create(file=("many.jsonl", _batch_file(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.id in [b.id for b in client.batches.list()]
    assert batch.id not in [b.id for b in other.batches.list()]
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(batch.id)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    batch = wait_for_batch(client, batch.id, "cancelled")
    counts = batch.request_counts
    assert batch.status == "cancelled" and counts.total == lines
    assert counts.completed + counts.failed == lines and counts.failed > lines // 2
    assert batch.cancelling_at <= batch.finalizing_at <= batch.cancelled_at
    answered = _lines(client, batch.output_file_id) if counts.completed else []
    cancelled = _lines(client, batch.error_file_id)
    assert (len(answered), len(cancelled)) == (counts.completed, counts.failed)
    assert {row["error"]["code"] for row in cancelled} == {"batch_cancelled"}
    assert sorted(row["custom_id"] for row in answered + cancelled) == sorted(f"q{i}" for i in range(lines))
    with pytest.raises(openai.NotFoundError):
        other.files.content(batch.error_file_id)


def _lines(client, file_id: str) -> list[dict]:
    return [json.loads(row) for row in client.files.content(file_id).text.splitlines()]


RANDOM = "random-weights"  # the shipped model is too sure of its tasks for sampling to change its answers


@pytest.fixture(scope="module")
def random_serve(tmp_path_factory):
    """``dllm serve`` with a small random-weight model (the project's tokenizer): near-uniform logits,
    so a draw shows in the text."""
    model = write_served_model(tmp_path_factory.mktemp("models") / RANDOM)
    with running(tmp_path_factory.mktemp("sampling"), "--model", str(model), "--api-key", KEY) as server:
        yield server


@pytest.fixture
def sampler(random_serve):
    return openai_client(random_serve, KEY)


def _ask(seed: int | None, prompt: str = LONG, **extra) -> dict:
    messages = [{"role": "user", "content": prompt}]
    return {"model": RANDOM, "messages": messages, "max_tokens": 24, "temperature": 1.0, "seed": seed} | extra


def _sampled(client, seed: int | None, **extra) -> list[str]:
    reply = client.chat.completions.create(**_ask(seed, **extra))
    return [choice.message.content for choice in reply.choices]


def test_a_seed_reproduces_a_sampled_answer_and_another_seed_changes_it(sampler):
    first = _sampled(sampler, 7)
    assert _sampled(sampler, 7) == first
    assert all(_sampled(sampler, seed) != first for seed in (8, 9))
    greedy = sampler.chat.completions.create(**(_ask(None) | {"temperature": None}))
    zero = sampler.chat.completions.create(**(_ask(None) | {"temperature": 0}))
    assert greedy.choices[0].message.content == zero.choices[0].message.content != first[0]


def test_n_gives_independent_choices_that_the_seed_reproduces(sampler):
    """Choice i draws with seed + i; the usage counts the prompt once, each choice's tokens."""
    one, three = (sampler.chat.completions.create(**_ask(21, n=n)) for n in (1, 3))
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # as OpenAI counts it
    assert three.usage.completion_tokens == sum(
        sampler.chat.completions.create(**_ask(21 + i)).usage.completion_tokens for i in range(3)
    )
    choices = _sampled(sampler, 21, n=3)
    assert len(choices) == 3 and len(set(choices)) == 3
    assert _sampled(sampler, 21, n=3) == choices
    assert [_sampled(sampler, 21 + i)[0] for i in range(3)] == choices  # choice i draws with seed + i


def test_n_streams_every_choice_with_its_index_and_the_usage_of_all(random_serve, sampler):
    whole = _sampled(sampler, 21, n=3)

    async def stream() -> list:
        async with openai_client(random_serve, KEY, asynchronous=True) as aclient:
            chunks = await aclient.chat.completions.create(
                **_ask(21, n=3), stream=True, stream_options={"include_usage": True}
            )
            return [chunk async for chunk in chunks]

    by_index = _stream_of(asyncio.run(stream()))
    (usage,) = by_index.pop(-1)
    assert {i: "".join(c.delta.content or "" for c in chunks) for i, chunks in by_index.items()} == dict(
        enumerate(whole)
    )
    assert all(chunks[-1].finish_reason in ("stop", "length") for chunks in by_index.values())
    reply = sampler.chat.completions.create(**_ask(21, n=3))
    assert usage.usage.completion_tokens == reply.usage.completion_tokens
    assert usage.usage.prompt_tokens == reply.usage.prompt_tokens  # the prompt once


def test_a_seeded_answer_is_the_same_alone_and_among_concurrent_requests(random_serve, sampler):
    """The product path's batch invariance: the worker batches concurrent requests into shared block
    cycles; a seeded request's answer does not depend on them."""
    alone = _sampled(sampler, 99)

    async def crowded() -> list[str]:
        async with openai_client(random_serve, KEY, asynchronous=True) as aclient:

            async def ask(seed: int, prompt: str) -> str:
                reply = await aclient.chat.completions.create(**_ask(seed, prompt))
                return reply.choices[0].message.content

            prompts = [LONG, "letters from a to k .", "count down from 9 ."] * 3
            return await asyncio.gather(ask(99, LONG), *(ask(s, p) for s, p in enumerate(prompts)))

    assert asyncio.run(crowded())[0] == alone[0]


def test_completion_logprobs_and_echo(client):
    reply = client.completions.create(model=MODEL, prompt=LONG, max_tokens=12, logprobs=2, echo=True)
    choice = reply.choices[0]
    assert choice.text.startswith(LONG.split()[0])  # the prompt's text comes first
    logprobs = choice.logprobs
    prompt_tokens = reply.usage.prompt_tokens
    assert logprobs.token_logprobs[:prompt_tokens] == [None] * prompt_tokens  # the echoed prompt
    generated = logprobs.token_logprobs[prompt_tokens:]
    assert len(generated) == reply.usage.completion_tokens - (choice.finish_reason == "stop")
    assert all(value <= 0 for value in generated)
    assert all(len(top) == 2 for top in logprobs.top_logprobs[prompt_tokens:])
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == sorted(logprobs.text_offset)


def test_chat_logprobs_with_alternatives(client):
    messages = [{"role": "user", "content": LONG}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == 10 and "".join(t.token for t in content) == reply.choices[0].message.content
    for token in content:  # greedy: the committed token is its step's likeliest
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob)
        assert bytes(token.bytes).decode() == token.token
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10)
    assert (
        plain.choices[0].logprobs is None
        and plain.choices[0].message.content == reply.choices[0].message.content
    )


def _stream_of(chunks) -> dict[int, list]:
    """Each choice's chunks (by index), the usage chunk under -1."""
    by_index: dict[int, list] = {}
    for chunk in chunks:
        if not chunk.choices:
            by_index.setdefault(-1, []).append(chunk)
        for choice in chunk.choices:
            by_index.setdefault(choice.index, []).append(choice)
    return by_index


def test_streamed_chat_logprobs_are_the_whole_answers_chunk_by_chunk(client):
    messages = [{"role": "user", "content": LONGER}]
    arguments = {"model": MODEL, "messages": messages, "max_tokens": 80, "logprobs": True, "top_logprobs": 2}
    whole = client.chat.completions.create(**arguments).choices[0]
    (choices,) = _stream_of(client.chat.completions.create(**arguments, stream=True)).values()
    streamed = [item for c in choices if c.logprobs is not None for item in c.logprobs.content]
    assert "".join(c.delta.content or "" for c in choices) == whole.message.content
    assert [t.token for t in streamed] == [t.token for t in whole.logprobs.content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in whole.logprobs.content])
    assert sum(c.logprobs is not None for c in choices) > 1, "a 60-token answer spans two blocks"


def test_streamed_completion_logprobs_with_echo(client):
    arguments = {"model": MODEL, "prompt": LONGER, "max_tokens": 80, "logprobs": 1, "echo": True}
    whole = client.completions.create(**arguments).choices[0]
    (choices,) = _stream_of(client.completions.create(**arguments, stream=True)).values()
    assert "".join(c.text for c in choices) == whole.text
    parts = [c.logprobs for c in choices if c.logprobs is not None]
    joined = {
        field: [value for part in parts for value in getattr(part, field)]
        for field in ("tokens", "token_logprobs", "text_offset")
    }
    assert joined["tokens"] == whole.logprobs.tokens and joined["text_offset"] == whole.logprobs.text_offset
    assert joined["token_logprobs"] == pytest.approx(whole.logprobs.token_logprobs)


def test_several_prompts_stream_each_as_its_own_choice(client):
    prompts = [LONG, "letters from a to k .", "count down from 9 ."]
    whole = client.completions.create(model=MODEL, prompt=prompts, max_tokens=30)
    stream = client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=30, stream=True, stream_options={"include_usage": True}
    )
    by_index = _stream_of(stream)
    (usage,) = by_index.pop(-1)
    assert sorted(by_index) == [0, 1, 2]
    for choice in whole.choices:
        assert "".join(c.text for c in by_index[choice.index]) == choice.text
        assert by_index[choice.index][-1].finish_reason == choice.finish_reason
    assert usage.usage.completion_tokens == whole.usage.completion_tokens
    twice = client.completions.create(model=MODEL, prompt=prompts, max_tokens=30, n=2)
    assert twice.usage.prompt_tokens == whole.usage.prompt_tokens == usage.usage.prompt_tokens
    assert [c.index for c in twice.choices] == list(range(6))


def test_batch_lines_honour_stop_strings_and_logprobs(client):
    """A batch line is answered as the endpoint answers it: cut at its stop string (finish_reason stop),
    with log probabilities where it asked."""
    messages = [{"role": "user", "content": LONG}]
    lines = [
        {"custom_id": "stopped", "body": {"messages": messages, "max_tokens": 40, "stop": [" 5"]}},
        {"custom_id": "logprobs", "body": {"messages": messages, "max_tokens": 8, "logprobs": True}},
    ]
    rows = [
        {"method": "POST", "url": "/v1/chat/completions"} | line | {"body": {"model": MODEL} | line["body"]}
        for line in lines
    ]
    source = client.files.create(
        file=("lines.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_for_batch(client, batch.id, "completed")
    output = {
        row["custom_id"]: row["response"]["body"]["choices"][0]
        for row in map(json.loads, client.files.content(batch.output_file_id).text.splitlines())
    }
    direct = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, stop=[" 5"])
    assert output["stopped"]["finish_reason"] == "stop" == direct.choices[0].finish_reason
    assert output["stopped"]["message"]["content"] == direct.choices[0].message.content == "1 2 3 4"
    content = output["logprobs"]["logprobs"]["content"]
    assert len(content) == 8 and all(item["logprob"] <= 0 for item in content)
    assert "".join(item["token"] for item in content) == output["logprobs"]["message"]["content"]
