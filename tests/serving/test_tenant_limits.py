"""Per-key limits on the product path: two ``python -m gateway`` processes against one redis-server, a
peer answering for the worker (``InstantPeer``), keys and their limits in a keys file laid out as a
Kubernetes Secret's volume (files behind a ``..data`` symlink, swapped on update)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.keys import ServiceKeys
from engine_pod.bench.gateway_cost import InstantPeer
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import free_port
from gateway.key_limits import tenant_of_key, tenant_of_name
from tests.serving.secret_volume import SecretVolume
from tests.serving_utils import WAIT_S, gateway_settings, wait_for

GENERATED = 8  # tokens the peer generates for every request
RATE_HEADERS = ("limit", "remaining", "reset")


@pytest.fixture
def volume(tmp_path):
    root = tmp_path / "secret"
    root.mkdir()
    return SecretVolume(root)


@pytest.fixture
def replicas(served_model, redis_server, service, volume):
    """Start two gateway processes on the keys file (call with its first text); both stopped after."""
    started: list[GatewayProcess] = []

    def start(keys_text: str, **settings) -> list[GatewayProcess]:
        volume.write(keys_text)
        env = gateway_settings(
            served_model, redis_server.url, service, max_tokens_limit=512, **settings
        ).to_env()
        env |= {"DLLM_API_KEYS_FILE": str(volume.path), "DLLM_API_KEYS_RELOAD_S": "0.5"}
        for _ in range(2):
            started.append(GatewayProcess("127.0.0.1", free_port(), env).start())
        return started

    yield start
    for gateway in started:
        gateway.stop()


@pytest.fixture
def peer(redis_server, service):
    peer = InstantPeer(redis_server.url, GENERATED, service)
    yield peer
    peer.halt.set()


def _post(gateway: GatewayProcess, key: str, max_tokens: int = 16, prompt: str = "hi") -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{gateway.url}/v1/completions", json=body, headers=headers, timeout=WAIT_S)


def _rate_headers(reply: httpx.Response, kind: str) -> dict[str, str]:
    return {part: reply.headers.get(f"x-ratelimit-{part}-{kind}") for part in RATE_HEADERS}


def _early_in_a_minute() -> bool:
    """Counts are per minute of the clock: a test that needs one window starts well inside one."""
    return time.time() % 60 < 35


def test_a_tenant_over_its_requests_per_minute_gets_429_from_both_replicas_while_another_is_served(
    replicas, peer
):
    peer.start()
    one, two = replicas("key-a rpm=3\nkey-b\n")
    wait_for(_early_in_a_minute, 60, 0.5, what="the start of a minute")
    remaining = []
    for gateway in (one, two, one):
        reply = _post(gateway, "key-a")
        assert reply.status_code == 200, reply.text
        headers = _rate_headers(reply, "requests")
        assert headers["limit"] == "3" and headers["reset"].endswith("s")
        remaining.append(int(headers["remaining"]))
    assert remaining == [2, 1, 0]  # one count for the two replicas
    for gateway in (one, two):
        refused = _post(gateway, "key-a")
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert _rate_headers(refused, "requests")["remaining"] == "0"
        assert _rate_headers(refused, "requests")["limit"] == "3"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        served = _post(gateway, "key-b")  # another tenant, no limit: served, without rate headers
        assert served.status_code == 200 and "x-ratelimit-limit-requests" not in served.headers
    client = openai.OpenAI(base_url=f"{two.url}/v1", api_key="key-a", max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        client.completions.create(model="tiny", prompt="hi", max_tokens=4)
    assert caught.value.code == "rate_limit_exceeded"
    rejections = _rejections([one, two], "key-b")  # counted as the tenant's limit, not as a full queue
    assert (rejections["rpm"], rejections["queue_full"], rejections["tpm"]) == (3, 0, 0), rejections


def test_a_rotated_key_works_and_the_old_one_stops_within_the_reload_interval(replicas, peer, volume):
    peer.start()
    gateways = replicas("key-old tenant=team rpm=100\n")
    assert all(_post(g, "key-old").status_code == 200 for g in gateways)
    volume.write("# rotated\nkey-new tenant=team rpm=100\n")  # as a Secret's update: no signal, no restart
    started = time.monotonic()
    for gateway in gateways:
        wait_for(lambda g=gateway: _post(g, "key-new").status_code == 200, 30, 0.2, what="the new key")
        wait_for(lambda g=gateway: _post(g, "key-old").status_code == 401, 30, 0.2, what="the old key off")
    assert time.monotonic() - started < 30
    reply = _post(gateways[0], "key-new")
    assert int(reply.headers["x-ratelimit-remaining-requests"]) < 99  # the tenant's count carried over


def _running(redis_url: str, service: str, key: str) -> int:
    return sync_client(redis_url).zcard(ServiceKeys(service).running_of(tenant_of_key(key)))


def test_a_tenant_at_its_concurrency_gets_429_until_a_request_ends(replicas, peer, redis_server, service):
    one, two = replicas("key-c concurrency=1\nkey-b\n")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_post, one, "key-c")  # no worker yet: it stays in flight
        wait_for(lambda: _running(redis_server.url, service, "key-c") == 1, what="one request in flight")
        refused = _post(two, "key-c")
        assert refused.status_code == 429, refused.text
        assert "in flight" in refused.json()["error"]["message"] and refused.headers["Retry-After"]
        peer.start()
        assert waiting.result(WAIT_S).status_code == 200
    assert _running(redis_server.url, service, "key-c") == 0  # released when it was answered
    assert _post(two, "key-c").status_code == 200


def test_a_stream_whose_client_left_frees_its_place(replicas, peer, redis_server, service):
    one, _ = replicas("key-c concurrency=1\n")
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 16, "stream": True}
    headers = {"Authorization": "Bearer key-c"}
    with httpx.stream("POST", f"{one.url}/v1/completions", json=body, headers=headers, timeout=WAIT_S) as r:
        assert r.status_code == 200
        wait_for(lambda: _running(redis_server.url, service, "key-c") == 1, what="the stream in flight")
    wait_for(lambda: _running(redis_server.url, service, "key-c") == 0, what="its place freed")


def test_tokens_per_minute_count_prompt_and_max_tokens_and_give_back_what_was_not_generated(replicas, peer):
    peer.start()
    one, two = replicas("key-t tpm=200\n")
    wait_for(_early_in_a_minute, 60, 0.5, what="the start of a minute")
    too_large = _post(one, "key-t", max_tokens=300)
    assert too_large.status_code == 429 and "tokens per minute" in too_large.json()["error"]["message"]
    first = _post(one, "key-t", max_tokens=100)
    assert first.status_code == 200, first.text
    prompt = first.json()["usage"]["prompt_tokens"]
    headers = _rate_headers(first, "tokens")
    assert (headers["limit"], int(headers["remaining"])) == ("200", 200 - prompt - 100)  # at admission
    # fits only because the 100 - GENERATED tokens the first did not generate were given back
    fits = 200 - 2 * prompt - GENERATED
    second = _post(two, "key-t", max_tokens=fits)
    assert second.status_code == 200, second.text
    assert _rate_headers(second, "tokens")["remaining"] == "0"
    left = 200 - 2 * (prompt + GENERATED)  # both gave back what they did not generate
    refused = _post(one, "key-t", max_tokens=left - prompt + 1)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(_rate_headers(refused, "tokens")["remaining"]) == left and refused.headers["Retry-After"]
    assert _post(two, "key-t", max_tokens=left - prompt).status_code == 200


def test_a_tenant_name_keeps_the_tenant_across_keys():
    assert tenant_of_name("team") != tenant_of_key("team")
    assert len(tenant_of_name("team")) == 32


def test_a_key_without_options_is_still_a_key(replicas, peer):
    peer.start()
    one, _ = replicas("plain-key\n# a comment\n\nlimited rpm=5 priority=low\n")
    assert _post(one, "plain-key").status_code == 200
    assert _post(one, "limited").headers["x-ratelimit-limit-requests"] == "5"
    assert _post(one, "unknown").status_code == 401


def test_a_keys_file_with_a_wrong_line_is_refused_at_start_without_the_key(tmp_path):
    from gateway.api_keys import ApiKeys
    from gateway.settings import GatewaySettings, SettingsError

    keys = tmp_path / "keys"
    keys.write_text("sk-secret rpm=many\n")
    with pytest.raises(SettingsError, match=f"the API keys file {keys}, line 1: rpm='many'") as caught:
        ApiKeys(GatewaySettings(api_keys_file=str(keys)))
    assert "sk-secret" not in str(caught.value)
    keys.write_text("# two keys, written with a space between them\nsk-secret sk-other\n")
    with pytest.raises(SettingsError, match=f"the API keys file {keys}, line 2: word 2 is not") as caught:
        ApiKeys(GatewaySettings(api_keys_file=str(keys)))
    assert "sk-" not in str(caught.value)


def test_a_wrong_line_written_later_keeps_the_keys_loaded(tmp_path):
    from gateway.api_keys import ApiKeys
    from gateway.settings import GatewaySettings

    keys = tmp_path / "keys"
    keys.write_text("sk-a rpm=2\n")
    loaded = ApiKeys(GatewaySettings(api_keys_file=str(keys)))
    keys.write_text("sk-a rpm=2 colour=blue\n")
    assert loaded.changed()
    loaded.reload()
    assert loaded.caller("sk-a").limits.rpm == 2


def _batch_file(gateway: GatewayProcess, key: str, lines: int) -> str:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 8}
    content = "".join(
        f'{{"custom_id": "j{i}", "method": "POST", "url": "/v1/completions", "body": {json.dumps(body)}}}\n'
        for i in range(lines)
    )
    reply = httpx.post(
        f"{gateway.url}/v1/files",
        files={"file": ("in.jsonl", content.encode())},
        data={"purpose": "batch"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=WAIT_S,
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["id"]


def _create_batch(gateway: GatewayProcess, key: str, file_id: str) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{gateway.url}/v1/batches", json=body, headers=headers, timeout=WAIT_S)


def test_a_tenant_at_its_queued_batch_lines_gets_429_until_a_batch_ends(replicas):
    one, two = replicas("key-q batch_lines=6\nkey-b\n")
    first = _create_batch(one, "key-q", _batch_file(one, "key-q", 4))
    assert first.status_code == 200, first.text
    second_file = _batch_file(two, "key-q", 4)
    refused = _create_batch(two, "key-q", second_file)  # 4 + 4 lines: over 6, from the other replica
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded" and refused.headers["Retry-After"]
    assert _create_batch(two, "key-b", _batch_file(two, "key-b", 4)).status_code == 200  # another tenant
    batch_id = first.json()["id"]
    headers = {"Authorization": "Bearer key-q"}
    assert httpx.post(f"{one.url}/v1/batches/{batch_id}/cancel", headers=headers).status_code == 200
    wait_for(
        lambda: (
            httpx.get(f"{one.url}/v1/batches/{batch_id}", headers=headers).json()["status"] == "cancelled"
        ),
        what="the first batch cancelled",
    )
    assert _create_batch(two, "key-q", second_file).status_code == 200  # its lines were given back


def _files(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)


def _rejections(gateways: list[GatewayProcess], key: str) -> dict[str, float]:
    """The gateways' ``dllm_gateway_rejected_total`` by reason, summed over them."""
    totals: dict[str, float] = {}
    for gateway in gateways:
        text = httpx.get(f"{gateway.url}/metrics", headers={"Authorization": f"Bearer {key}"}).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "dllm_gateway_rejected_total":
                    reason = sample.labels["reason"]
                    totals[reason] = totals.get(reason, 0) + sample.value
    return totals


def test_a_key_past_its_storage_limit_gets_400_from_both_replicas_while_others_upload(replicas):
    """``storage=`` on a key's line is its own quota; a key without it has the service's, 0 none."""
    one, two = replicas("key-s storage=3000\nkey-d\nkey-u storage=0\n", storage_quota_bytes=5000)
    line = b'{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {}}\n'
    content = line * (2000 // len(line))  # about 2000 bytes
    kept = _files(one, "key-s").files.create(file=("a.jsonl", content), purpose="batch")
    with pytest.raises(openai.BadRequestError) as caught:  # its 3000 bytes, counted across the replicas
        _files(two, "key-s").files.create(file=("b.jsonl", content), purpose="batch")
    error = caught.value.body
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "storage_quota_exceeded",
        "file",
    )
    assert "quota of 3000 bytes" in error["message"]
    for _ in range(2):  # the service's 5000 bytes
        _files(two, "key-d").files.create(file=("d.jsonl", content), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="quota of 5000 bytes"):
        _files(one, "key-d").files.create(file=("d.jsonl", content), purpose="batch")
    for gateway in (one, two, one):  # storage=0: no limit
        _files(gateway, "key-u").files.create(file=("u.jsonl", content), purpose="batch")
    _files(two, "key-s").files.delete(kept.id)  # its bytes leave the count: the upload now fits
    assert _files(two, "key-s").files.create(file=("b.jsonl", content), purpose="batch").bytes == len(content)
    rejections = _rejections([one, two], "key-u")
    assert rejections["storage"] == 2 and rejections["queue_full"] == 0, rejections
