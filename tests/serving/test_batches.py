"""The batch API: upload JSONL, create a batch, poll its progress, read the results file."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import redis

from dllm_contracts.queue.keys import ServiceKeys
from gateway.stored_files import RECORD_GRACE_S
from tests.serving_utils import WAIT_S, GatewayServer, gateway_settings, wait_for


def _line(index: int, endpoint: str = "/v1/completions") -> dict:
    body = {"model": "tiny", "prompt": f"letters from a to {'bcdef'[index % 5]} .", "max_tokens": 8}
    if endpoint == "/v1/chat/completions":
        body = {"model": "tiny", "messages": [{"role": "user", "content": body["prompt"]}], "max_tokens": 8}
    return {"custom_id": f"job-{index}", "method": "POST", "url": endpoint, "body": body}


def _upload(client: httpx.Client, lines: list[dict | str]) -> str:
    content = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    reply = client.post(
        "/v1/files", files={"file": ("in.jsonl", content.encode())}, data={"purpose": "batch"}
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["id"]


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_batch_round_trip_with_an_invalid_line(
    served_model, single_or_cluster, service, make_worker, endpoint
):
    redis_server = single_or_cluster
    lines = [_line(i, endpoint) for i in range(12)] + ["{not json"]
    lines[3]["body"]["temperature"] = 0.8  # sampled with no seed: the line draws its own
    echo = _line(12, endpoint) | {"custom_id": "echoed"}
    echo["body"] = echo["body"] | {"echo": True}  # a batch line cannot echo (chat has no such field)
    lines.append(echo)
    settings = gateway_settings(served_model, redis_server.url, service)
    with (
        GatewayServer(settings) as gateway,
        make_worker(redis_server.url, service),
        httpx.Client(base_url=gateway.url, timeout=30) as client,
    ):
        file_id = _upload(client, lines)
        created = client.post(
            "/v1/batches", json={"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        )
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]

        def finished():
            batch = client.get(f"/v1/batches/{batch_id}").json()
            return batch if batch["status"] == "completed" else None

        def answered():
            return client.get(f"/v1/batches/{batch_id}").json()["request_counts"]

        batch = wait_for(finished, 120, what="the batch to complete", progress=answered)
        assert batch["request_counts"] == {"total": 14, "completed": 12, "failed": 2}
        times = [batch[f] for f in ("created_at", "in_progress_at", "finalizing_at", "completed_at")]
        assert times == sorted(times) and batch["expires_at"] == batch["created_at"] + 24 * 3600
        results = _file_lines(client, batch["output_file_id"])
        errors = _file_lines(client, batch["error_file_id"])
        listed = client.get("/v1/files", params={"purpose": "batch_output"}).json()["data"]
        deleted = client.delete(f"/v1/files/{batch['error_file_id']}")
        gone = client.get(f"/v1/files/{batch['error_file_id']}").status_code
    assert {f["id"] for f in listed} == {batch["output_file_id"], batch["error_file_id"]}
    assert deleted.json()["deleted"] is True and gone == 404
    assert len(results) == 12 and len(errors) == 2
    by_id = {r["custom_id"]: r for r in results + errors}
    assert by_id["line-13"]["error"]["code"] == "invalid_request"
    assert by_id["echoed"]["error"]["code"] == "invalid_request"
    if endpoint == "/v1/completions":
        assert "echo" in by_id["echoed"]["error"]["message"]
    for index in range(12):
        result = by_id[f"job-{index}"]
        assert result["error"] is None and result["response"]["status_code"] == 200
        assert result["response"]["body"]["usage"]["completion_tokens"] >= 1
        prefix = "chatcmpl-" if endpoint == "/v1/chat/completions" else "cmpl-"
        assert result["response"]["body"]["id"].startswith(prefix)


def _file_lines(client: httpx.Client, file_id: str) -> list[dict]:
    reply = client.get(f"/v1/files/{file_id}/content")
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines()]


def test_large_batch_is_ingested_without_blocking_the_event_loop(served_model, redis_server, service):
    settings = gateway_settings(served_model, redis_server.url, service, batch_chunk=100)
    with GatewayServer(settings) as gateway, httpx.Client(base_url=gateway.url, timeout=30) as client:
        file_id = _upload(client, [_line(i) for i in range(5000)])
        batch_id = client.post(
            "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions"}
        ).json()["id"]
        members = redis.Redis.from_url(redis_server.url)
        queued = ServiceKeys(service).batch_members(batch_id)
        # the event loop keeps answering while ingestion is still under way
        health_during = client.get("/healthz").status_code
        queued_then = members.llen(queued)
        wait_for(lambda: members.llen(queued) == 5000, 120, what="ingestion to finish")
        batch = client.get(f"/v1/batches/{batch_id}").json()
    assert health_during == 200 and queued_then < 5000
    assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == 5000


def test_batch_errors_are_clear(served_model, redis_server, service):
    with (
        GatewayServer(gateway_settings(served_model, redis_server.url, service)) as gateway,
        httpx.Client(base_url=gateway.url) as client,
    ):
        assert (
            client.post(
                "/v1/batches", json={"input_file_id": "file-nope", "endpoint": "/v1/completions"}
            ).status_code
            == 404
        )
        assert client.get("/v1/batches/batch-nope").status_code == 404
        wrong = client.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "fine-tune"})
        assert wrong.status_code == 400 and "purpose" in wrong.json()["error"]["message"]
        bad_endpoint = client.post("/v1/batches", json={"input_file_id": "x", "endpoint": "/v1/embeddings"})
        assert bad_endpoint.status_code == 400


def _expires_within(client: redis.Redis, service: str, file_id: str, ttl_s: int) -> None:
    """The file's retention ends within ``ttl_s`` (the sweeper drops it then), and its record's key
    expires in Redis too, a grace later."""
    keys = ServiceKeys(service)
    assert 0 < client.zscore(keys.files_expiring, file_id) - time.time() <= ttl_s
    assert 0 < client.ttl(keys.file(file_id)) <= ttl_s + RECORD_GRACE_S


def test_files_batches_and_their_results_expire_and_a_batch_file_is_bounded(
    served_model, redis_server, service, make_worker
):
    settings = gateway_settings(
        served_model, redis_server.url, service, file_ttl_s=500, batch_ttl_s=400, max_batch_lines=3
    )
    client = redis.Redis.from_url(redis_server.url)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions"}
    lines = [
        json.dumps(line | {"custom_id": c, "body": {"model": "tiny", "prompt": "hi", "max_tokens": 8}})
        for c in "ab"
    ]
    with (
        GatewayServer(settings) as gateway,
        make_worker(redis_server.url, service),
        httpx.Client(base_url=gateway.url, timeout=60) as http,
    ):
        big = http.post(
            "/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", "\n".join(lines * 2))}
        )
        refused = http.post(
            "/v1/batches",
            json={
                "input_file_id": big.json()["id"],
                "endpoint": "/v1/completions",
                "completion_window": "24h",
            },
        )
        assert refused.status_code == 400 and "at most 3" in refused.json()["error"]["message"]
        upload = http.post(
            "/v1/files", data={"purpose": "batch"}, files={"file": ("a.jsonl", "\n".join(lines))}
        )
        file_id = upload.json()["id"]
        _expires_within(client, service, file_id, 500)
        batch = http.post(
            "/v1/batches",
            json={"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"},
        ).json()
        wait_for(
            lambda: http.get(f"/v1/batches/{batch['id']}").json()["status"] == "completed",
            WAIT_S,
            what="the batch",
        )
        output_file_id = http.get(f"/v1/batches/{batch['id']}").json()["output_file_id"]
    assert 0 < client.ttl(ServiceKeys(service).batch(batch["id"])) <= 400
    assert not client.exists(ServiceKeys(service).batch_results(batch["id"]))  # now in its output file
    _expires_within(client, service, output_file_id, 500)
    for key in client.scan_iter(ServiceKeys(service).request("*")):
        assert 0 < client.ttl(key) <= settings.result_ttl_s  # finished requests' records expire too
