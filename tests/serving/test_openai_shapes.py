"""What the official ``openai`` client sees is what OpenAI sends: a stream's role in its first chunk only,
a ``system_fingerprint``, files ``processed``, ids of OpenAI's form, errors in OpenAI's JSON for URLs no
route serves, and batch input files refused or reported as OpenAI does. One ``dllm serve`` of the shipped
model (``keyed_serve``), through the official client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import redis

from tests.serving.conftest import KEY, SERVED
from tests.serving.serve_process import openai_client, wait_for_batch

MODEL = SERVED
PROMPT = "count from 1 to 21 ."  # answered with 22 tokens
LONGER = "count from 1 to 60 ."  # answered with 60 tokens: two blocks, each a chunk


@pytest.fixture
def serve(keyed_serve):
    return keyed_serve


@pytest.fixture
def client(serve):
    return openai_client(serve, KEY)


def test_a_streamed_chat_says_the_role_in_each_choices_first_chunk_only(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": LONGER}], max_tokens=64, n=2, stream=True
    )
    by_choice: dict[int, list] = {}
    for chunk in stream:
        for choice in chunk.choices:
            by_choice.setdefault(choice.index, []).append(choice.delta)
    assert sorted(by_choice) == [0, 1]
    for deltas in by_choice.values():
        assert len(deltas) >= 3  # two blocks' text, then the finish reason
        assert all(d.content for d in deltas[:2])
        assert deltas[0].role == "assistant"
        assert [d.role for d in deltas[1:]] == [None] * (len(deltas) - 1)


def test_answers_and_chunks_carry_one_system_fingerprint(client):
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stream=True))
    assert chat.system_fingerprint and chat.system_fingerprint.startswith("fp_")
    fingerprints = {chat.system_fingerprint, completion.system_fingerprint}
    fingerprints |= {c.system_fingerprint for c in chunks + texts}
    assert fingerprints == {chat.system_fingerprint}


def test_files_are_processed_when_uploaded_retrieved_and_listed(client):
    uploaded = client.files.create(file=("one.jsonl", _rows([_row("a")])), purpose="batch")
    assert uploaded.id.startswith("file-") and uploaded.status == "processed"
    assert client.files.retrieve(uploaded.id).status == "processed"
    assert {f.status for f in client.files.list()} == {"processed"}
    assert uploaded.expires_at > uploaded.created_at


def test_unknown_urls_and_methods_are_answered_in_openais_error_json(serve, client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model=MODEL, input="hello")
    error = missing.value.body
    assert error["code"] == "unknown_url" and error["type"] == "invalid_request_error"
    assert "POST /v1/embeddings" in error["message"] and error["param"] is None
    headers = {"authorization": f"Bearer {KEY}"}
    for method, path, status in [
        ("GET", "/v1/no/such/thing", 404),
        ("DELETE", "/v2/completions", 404),
        ("GET", "/v1/chat/completions", 405),
        ("PUT", "/v1/models", 405),
    ]:
        reply = httpx.request(method, f"{serve.url}{path}", headers=headers)
        assert reply.status_code == status, (method, path)
        body = reply.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        assert f"{method} {path}" in body["error"]["message"]
        assert body["error"]["code"] == ("unknown_url" if status == 404 else "method_not_allowed")
    assert httpx.get(f"{serve.url}/v1/chat/completions", headers=headers).headers["allow"] == "POST"


def _row(custom_id: str, messages: list | None = None) -> dict:
    messages = [{"role": "user", "content": PROMPT}] if messages is None else messages
    body = {"model": MODEL, "messages": messages, "max_tokens": 8}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _rows(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def test_a_batch_file_with_a_repeated_custom_id_is_refused_naming_it_and_its_lines(client):
    rows = [_row("a"), _row("b"), _row("c"), _row("b")]
    source = client.files.create(file=("twice.jsonl", _rows(rows)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    error = refused.value.body
    assert error["code"] == "duplicate_custom_id" and error["param"] == "input_file_id"
    assert "'b'" in error["message"] and "lines 2 and 4" in error["message"]
    assert source.id not in {b.input_file_id for b in client.batches.list()}


def test_batch_ids_are_openais_and_a_bad_line_is_reported_by_field_and_line(client):
    rows = [_row("good"), _row("empty", messages=[])]
    source = client.files.create(file=("lines.jsonl", _rows(rows)), purpose="batch")
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.id.startswith("batch_") and batch.input_file_id.startswith("file-")
    batch = wait_for_batch(client, batch.id)
    assert batch.output_file_id.startswith("file-") and batch.error_file_id.startswith("file-")
    (row,) = [json.loads(line) for line in client.files.content(batch.error_file_id).text.splitlines()]
    error = row["error"]
    assert row["custom_id"] == "empty" and error["line"] == 2 and error["param"] == "body.messages"
    assert error["message"].startswith("line 2: messages: ") and "validation error" not in error["message"]
    (answered,) = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert answered["id"].startswith("batch_req_") and answered["custom_id"] == "good"
    assert answered["response"]["body"]["system_fingerprint"].startswith("fp_")


def test_a_batch_stored_under_the_old_id_form_is_still_found_by_its_id(serve, client):
    """Batches created before ids took OpenAI's ``batch_`` form keep their ``batch-`` ids."""
    source = client.files.create(file=("old.jsonl", _rows([_row("x")])), purpose="batch")
    batch = wait_for_batch(
        client,
        client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id,
    )
    old_id = "batch-" + batch.id.removeprefix("batch_")
    store = redis.Redis(port=serve.redis_port())
    _rename(store, batch.id, old_id)
    found = client.batches.retrieve(old_id)
    assert (found.id, found.status, found.output_file_id) == (old_id, "completed", batch.output_file_id)
    assert old_id in {b.id for b in client.batches.list()}
    with pytest.raises(openai.ConflictError):  # found, and finished: only a running batch is cancelled
        client.batches.cancel(old_id)


def _rename(store: redis.Redis, new_id: str, old_id: str) -> None:
    """What an older gateway would have stored: every key and index entry of the batch under ``old_id``."""
    for key in list(store.scan_iter(match=f"*{new_id}*")):
        store.rename(key, key.replace(new_id.encode(), old_id.encode()))
    for key in list(store.scan_iter(_type="zset")):
        score = store.zscore(key, new_id)
        if score is not None:
            store.zadd(key, {old_id: score})
            store.zrem(key, new_id)
