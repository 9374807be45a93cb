"""Files in the file store, through ``python -m gateway`` processes, a real Redis and the official client:
uploads and downloads streamed in bounded memory, files intact across a gateway ``kill -9``, an upload
killed midway leaving nothing behind, the per-tenant storage quota, retention deleting from the store."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import redis

from dllm_contracts.queue.keys import ServiceKeys
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import free_port
from gateway.file_store import PARTIAL
from gateway.settings import GatewaySettings
from gateway.tenancy import ANONYMOUS, tenant_of_key
from tests.serving_utils import WAIT_S, gateway_settings, wait_for

MIB = 1 << 20
RSS_GROWTH_LIMIT = 50 * MIB  # what a streamed upload and download may add to the gateway's memory


def _settings(model: Path, redis_url: str, service: str, store: str, **overrides) -> GatewaySettings:
    values = dict(redis_url=redis_url, service=service, model_dir=str(model), model_name="tiny")
    values |= dict(file_store=store, max_upload_bytes=512 * MIB, access_log=False)
    return GatewaySettings(**(values | overrides))


def _start(settings: GatewaySettings, extra_env: dict[str, str] | None = None) -> GatewayProcess:
    env = settings.to_env() | (extra_env or {})
    return GatewayProcess("127.0.0.1", free_port(), env, {"stdout": subprocess.DEVNULL}).start()


def _kill(gateway: GatewayProcess) -> None:
    gateway.process.send_signal(signal.SIGKILL)
    gateway.process.wait(timeout=30)


def _client(gateway: GatewayProcess, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=WAIT_S)


def _jsonl_file(path: Path, size: int) -> str:
    """A batch-shaped JSONL file of about ``size`` bytes at ``path``; its sha256."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        written, index = 0, 0
        while written < size:
            pad = os.urandom(24 * 1024).hex()
            line = (
                f'{{"custom_id": "r{index}", "method": "POST", "url": "/v1/completions", "pad": "{pad}"}}\n'
            )
            data = line.encode()
            out.write(data)
            digest.update(data)
            written, index = written + len(data), index + 1
    return digest.hexdigest()


def _download_sha(client: openai.OpenAI, file_id: str) -> str:
    digest = hashlib.sha256()
    with client.with_streaming_response.files.content(file_id) as reply:
        for chunk in reply.iter_bytes():
            digest.update(chunk)
    return digest.hexdigest()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class PeakRss:
    """The highest resident memory of a process, sampled every few milliseconds in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.stop = pid, _rss(pid), threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(0.01):
            self.peak = max(self.peak, _rss(self.pid))

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def _round_trip_in_bounded_memory(settings: GatewaySettings, tmp_path: Path, size: int) -> None:
    source = tmp_path / "big.jsonl"
    expected = _jsonl_file(source, size)
    gateway = _start(settings)
    try:
        client = _client(gateway)
        warm = client.files.create(file=("warm.jsonl", b'{"custom_id": "w"}\n' * 1000), purpose="batch")
        _download_sha(client, warm.id)  # what a first upload and download load, loaded before measuring
        before = _rss(gateway.process.pid)
        with PeakRss(gateway.process.pid) as peak, source.open("rb") as body:
            uploaded = client.files.create(file=("big.jsonl", body), purpose="batch")
            assert uploaded.bytes == source.stat().st_size
            assert _download_sha(client, uploaded.id) == expected
        growth = peak.peak - before
        assert growth < RSS_GROWTH_LIMIT, f"the gateway's memory grew by {growth / MIB:.0f} MiB"
    finally:
        gateway.stop()


def test_a_300_mib_upload_and_download_stream_in_bounded_memory(
    served_model, redis_server, service, tmp_path
):
    settings = _settings(served_model, redis_server.url, service, str(tmp_path / "files"))
    _round_trip_in_bounded_memory(settings, tmp_path, 300 * MIB)


def test_files_are_intact_across_a_gateway_kill(served_model, redis_server, service, tmp_path):
    settings = _settings(served_model, redis_server.url, service, str(tmp_path / "files"))
    source = tmp_path / "in.jsonl"
    expected = _jsonl_file(source, 3 * MIB)
    gateway = _start(settings)
    with source.open("rb") as body:
        uploaded = _client(gateway).files.create(file=("in.jsonl", body), purpose="batch")
    _kill(gateway)
    gateway = _start(settings)
    try:
        client = _client(gateway)
        assert client.files.retrieve(uploaded.id).bytes == source.stat().st_size
        assert _download_sha(client, uploaded.id) == expected
    finally:
        gateway.stop()


def _post_part_of_an_upload(gateway: GatewayProcess, sent: int) -> socket.socket:
    """An upload whose body declares 64 MiB and sends ``sent`` bytes of its file, then waits."""
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    request = (
        f"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {64 * MIB}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.sendall(request + head + b'{"custom_id": "x"}\n' * (sent // 19))
    return sock


def test_an_upload_killed_midway_leaves_no_record_and_its_bytes_are_swept(
    served_model, redis_server, service, tmp_path
):
    store = tmp_path / "files"
    settings = _settings(
        served_model, redis_server.url, service, str(store), max_upload_s=2.0, file_sweep_s=0.2
    )
    gateway = _start(settings)
    partial = store / PARTIAL
    sock = _post_part_of_an_upload(gateway, 4 * MIB)
    wait_for(lambda: sum(p.stat().st_size for p in partial.iterdir()) > MIB, what="bytes being written")
    _kill(gateway)
    sock.close()
    assert any(partial.iterdir())  # what the kill left
    gateway = _start(settings)
    try:
        keys, client = ServiceKeys(service), redis.Redis.from_url(redis_server.url)
        wait_for(lambda: not any(partial.iterdir()), what="the unfinished upload's bytes swept")
        wait_for(lambda: client.zcard(keys.files_uploading) == 0, what="the unfinished upload forgotten")
        assert _client(gateway).files.list().data == []
        assert not (store / service).exists() or not any((store / service).iterdir())  # nothing committed
    finally:
        gateway.stop()


def test_a_tenant_over_its_storage_quota_is_refused_while_another_uploads(
    served_model, redis_server, service, tmp_path
):
    settings = _settings(
        served_model,
        redis_server.url,
        service,
        str(tmp_path / "files"),
        api_keys=("key-a", "key-b"),
        storage_quota_bytes=3 * MIB,
    )
    content = b'{"custom_id": "x"}\n' * (MIB // 19)  # about 1 MiB
    gateway = _start(settings)
    try:
        a, b = _client(gateway, "key-a"), _client(gateway, "key-b")
        kept = [a.files.create(file=("a.jsonl", content), purpose="batch") for _ in range(2)]
        with ThreadPoolExecutor(2) as pool:
            refused = pool.submit(a.files.create, file=("big.jsonl", content * 2), purpose="batch")
            others = [
                pool.submit(b.files.create, file=("b.jsonl", content), purpose="batch") for _ in range(2)
            ]
            with pytest.raises(openai.BadRequestError) as caught:
                refused.result()
            assert all(o.result().bytes == len(content) for o in others)
        error = caught.value.body
        assert error["code"] == "storage_quota_exceeded" and error["param"] == "file"
        assert caught.value.status_code == 400 and "quota" in error["message"]
        used = redis.Redis.from_url(redis_server.url).get(
            ServiceKeys(service).storage_used(tenant_of_key("key-a"))
        )
        assert int(used) == 2 * len(content)
        a.files.delete(kept[0].id)  # its bytes leave the quota: the upload now fits
        assert a.files.create(file=("big.jsonl", content * 2), purpose="batch").bytes == 2 * len(content)
    finally:
        gateway.stop()


def test_a_file_past_its_retention_leaves_the_store_and_the_quota(
    served_model, redis_server, service, tmp_path
):
    store = tmp_path / "files"
    settings = _settings(served_model, redis_server.url, service, str(store), file_ttl_s=2, file_sweep_s=0.2)
    gateway = _start(settings)
    try:
        client, keys = _client(gateway), ServiceKeys(service)
        uploaded = client.files.create(file=("a.jsonl", b'{"custom_id": "x"}\n'), purpose="batch")
        assert (store / service / uploaded.id).is_file()
        wait_for(
            lambda: not (store / service / uploaded.id).exists(), what="the expired file's bytes deleted"
        )
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(uploaded.id)
        assert not redis.Redis.from_url(redis_server.url).exists(keys.storage_used(ANONYMOUS))
    finally:
        gateway.stop()


def test_a_batchs_output_is_intact_across_gateway_kills(
    served_model, redis_server, service, make_worker, tmp_path
):
    settings = gateway_settings(served_model, redis_server.url, service, file_store=str(tmp_path / "files"))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count to 5 ."}], "max_tokens": 8}
    lines = [
        json.dumps({"custom_id": f"job-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        for i in range(6)
    ]
    gateway = _start(settings)
    client = _client(gateway)
    source = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    _kill(gateway)  # the batch's gateway dies: another takes it over, ingests and writes its output
    gateway = _start(settings)
    with make_worker(redis_server.url, service):
        client = _client(gateway)
        done = wait_for(
            lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b,
            what="the batch to complete on the gateway that took it over",
        )
    output = client.files.content(done.output_file_id).content
    assert sorted(json.loads(line)["custom_id"] for line in output.splitlines()) == [
        f"job-{i}" for i in range(6)
    ]
    _kill(gateway)
    gateway = _start(settings)
    try:
        assert _download_sha(_client(gateway), done.output_file_id) == hashlib.sha256(output).hexdigest()
    finally:
        gateway.stop()
