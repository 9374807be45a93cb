"""``dllm serve`` reads every gateway setting from the environment the gateway reads, flags over it: an API
keys file re-read on SIGHUP (keys never silently off), unknown fields ignored when asked, body and upload
limits, the batch completion window. One ``dllm serve`` for the module, started the way README shows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from dllm_contracts.defaults import DEFAULT_MODEL
from engine_pod.cli.main import build_parser
from engine_pod.cli.serve_settings import gateway_settings, queue_settings
from gateway.settings import GatewaySettings
from tests.serving.conftest import SERVED
from tests.serving.serve_process import openai_client, running
from tests.serving_utils import WAIT_S, wait_for

FIRST, SECOND = "first-key", "second-key"
WINDOW_S = 3  # the batch completion window of this module's service


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text(f"# one key a line\n{FIRST}\n")
    return path


@pytest.fixture(scope="module")
def serve(tmp_path_factory, keys_file):
    env = {
        "DLLM_API_KEYS_FILE": str(keys_file),
        "DLLM_UNKNOWN_FIELDS": "ignore",
        "DLLM_MAX_BODY_BYTES": "100000",
        "DLLM_MAX_UPLOAD_BYTES": "200000",
        "DLLM_BATCH_WINDOW_S": str(WINDOW_S),
        "DLLM_MAX_TOKENS": "20",  # the flag below overrides it
    }
    with running(tmp_path_factory.mktemp("settings"), "--max-tokens-limit", "40", env=env) as server:
        yield server


def _status(serve, key: str | None) -> int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{serve.url}/v1/models", headers=headers, timeout=10).status_code


def test_keys_come_from_the_file_and_sighup_reloads_it(serve, keys_file):
    assert (_status(serve, FIRST), _status(serve, SECOND), _status(serve, None)) == (200, 401, 401)
    assert httpx.get(f"{serve.url}/metrics", timeout=10).status_code == 401
    try:
        keys_file.write_text(f"{SECOND}\n")
        serve.process.send_signal(signal.SIGHUP)
        wait_for(lambda: _status(serve, SECOND) == 200, interval_s=0.1, what="the new key to be accepted")
        assert _status(serve, FIRST) == 401
        reloaded = f"API keys reloaded from {keys_file}: 1 keys (were 1)"
        wait_for(lambda: reloaded in serve.log.read_text(), interval_s=0.1, what="the reload to be logged")
        keys_file.write_text("\n")  # no key at all: every request is refused, the API never opens
        serve.process.send_signal(signal.SIGHUP)
        wait_for(lambda: _status(serve, SECOND) == 401, interval_s=0.1, what="the emptied file to be read")
        assert _status(serve, None) == 401
        wait_for(
            lambda: ": 0 keys (were 1)" in serve.log.read_text(), interval_s=0.1, what="the reload logged"
        )
        log = serve.log.read_text()
        assert "API keys on); Ctrl-C stops" in log  # the startup line
        assert FIRST not in log and SECOND not in log  # how many keys, never which
    finally:
        keys_file.write_text(f"{FIRST}\n")
        serve.process.send_signal(signal.SIGHUP)
        wait_for(lambda: _status(serve, FIRST) == 200, interval_s=0.1, what="the first key back")


def test_dllm_bench_without_the_key_is_one_line_with_the_401(serve):
    argv = [sys.executable, "-m", "engine_pod.cli.main", "bench", "--url", serve.url, "--concurrency", "1"]
    done = subprocess.run([*argv, "--requests", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dllm bench: error: {serve.url}/v1/models: HTTP 401: ")


def test_flags_override_the_environment_and_unknown_fields_can_be_ignored(serve):
    client = openai_client(serve, FIRST)
    messages = [{"role": "user", "content": "count to 5 ."}]
    reply = client.chat.completions.create(
        model=SERVED, messages=messages, max_tokens=30, extra_body={"foo": 1}
    )
    assert reply.choices[0].message.content  # DLLM_MAX_TOKENS=20 lost to --max-tokens-limit 40
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=SERVED, messages=messages, max_tokens=41)
    assert refused.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):  # ignored means unknown, not unsupported
        client.chat.completions.create(model=SERVED, messages=messages, extra_body={"tools": [{"type": "x"}]})


def test_the_body_and_upload_limits_are_the_environments(serve):
    client = openai_client(serve, FIRST)
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(model=SERVED, prompt="a" * 150_000)
    assert refused.value.status_code == 413
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {}}) + "\n"
    content = (line * (150_000 // len(line))).encode()  # above the body limit, below the upload limit
    assert client.files.create(file=("a.jsonl", content), purpose="batch").bytes == len(content)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("b.jsonl", content * 2), purpose="batch")
    assert refused.value.status_code == 413


def test_lines_not_started_when_the_window_closes_expire_with_their_custom_ids(serve):
    client = openai_client(serve, FIRST)
    body = {"model": SERVED, "messages": [{"role": "user", "content": "count to 5 ."}], "max_tokens": 8}
    rows = [
        {"custom_id": f"late-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(5)
    ]
    source = client.files.create(
        file=("w.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()), purpose="batch"
    )
    worker = serve.children()["worker"]
    os.kill(worker, signal.SIGSTOP)  # a worker that takes nothing: no line starts within the window
    try:
        batch = client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.expires_at == batch.created_at + WINDOW_S
        batch = wait_for(
            lambda: (b := client.batches.retrieve(batch.id)).status == "expired" and b,
            WAIT_S + WINDOW_S,
            0.2,
            "the batch to expire",
        )
    finally:
        os.kill(worker, signal.SIGCONT)
    assert batch.expired_at >= batch.expires_at and batch.output_file_id is None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (0, 5)
    errors = [json.loads(row) for row in client.files.content(batch.error_file_id).text.splitlines()]
    assert sorted(row["custom_id"] for row in errors) == [f"late-{i}" for i in range(5)]
    assert {row["error"]["code"] for row in errors} == {"batch_expired"}


def test_a_keys_file_that_cannot_be_read_ends_serve_with_one_line(tmp_path):
    missing = tmp_path / "no-such-file"
    done = subprocess.run(
        [sys.executable, "-m", "engine_pod.cli.main", "serve", "--api-keys-file", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("dllm serve: error: cannot read the API keys file")


@pytest.mark.parametrize("content", ["sk-secret rpm=\u00b2\n".encode(), b"# caf\xe9\nsk-secret\n"])
def test_a_keys_file_serve_cannot_use_ends_it_with_one_line_naming_the_line(tmp_path, content):
    keys = tmp_path / "keys"
    keys.write_bytes(content)
    done = subprocess.run(
        [sys.executable, "-m", "engine_pod.cli.main", "serve", "--api-keys-file", str(keys)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dllm serve: error: the API keys file {keys}, line 1: "), last
    assert "sk-secret" not in done.stderr


@pytest.mark.parametrize(
    "env, drain_s", [({}, GatewaySettings.drain_timeout_s), ({"DLLM_DRAIN_TIMEOUT_S": "7"}, 7)]
)
def test_the_gateways_drain_under_dllm_serve_is_the_gateways_own_setting(monkeypatch, env, drain_s):
    """One default (GatewaySettings, 30 s, as docs/api.md says), and DLLM_DRAIN_TIMEOUT_S over it."""
    monkeypatch.delenv("DLLM_DRAIN_TIMEOUT_S", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["serve"])
    queue_settings(args)
    assert gateway_settings(args, Path(DEFAULT_MODEL)).drain_timeout_s == drain_s == (30 if not env else 7)


def test_dllm_serve_keeps_files_under_its_data_directory(monkeypatch, tmp_path):
    """The gateway's file store: the data directory's files/ (beside Redis's data), unless
    DLLM_FILE_STORE names another."""
    monkeypatch.delenv("DLLM_FILE_STORE", raising=False)
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path)])
    queue_settings(args)
    assert gateway_settings(args, Path(DEFAULT_MODEL)).file_store == str(tmp_path / "files")
    monkeypatch.setenv("DLLM_FILE_STORE", "s3://bucket/files")
    assert gateway_settings(args, Path(DEFAULT_MODEL)).file_store == "s3://bucket/files"
