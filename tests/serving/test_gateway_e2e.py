"""End to end through real HTTP: gateway (uvicorn) -> real Redis -> engine worker -> back."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import openai
import pytest
import redis

from dllm_contracts.queue.keys import ServiceKeys
from dllm_contracts.queue.messages import QueuedRequest
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from engine_pod.serve.redis_server import free_port
from gateway.settings import GatewaySettings, SettingsError
from tests.serving_utils import BLOCK, GatewayServer, completion, gateway_settings


@pytest.fixture
def stack(served_model, redis_server, service, make_worker):
    with (
        GatewayServer(gateway_settings(served_model, redis_server.url, service)) as gateway,
        make_worker(redis_server.url, service),
        httpx.Client(base_url=gateway.url, timeout=60) as client,
    ):
        yield client


def test_completion_chat_and_models(stack):
    models = stack.get("/v1/models").json()
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["block_length"] == BLOCK
    reply = completion(stack, "count from 3 to 9 .", max_tokens=16)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "text_completion"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 16
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    chat = stack.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    assert chat.json()["usage"]["prompt_tokens"] == 4  # bos, <|user|>, hi, <|assistant|>


def test_several_prompts_in_one_request(stack):
    reply = completion(stack, ["copy : cat dog .", "letters from a to c ."], max_tokens=8)
    assert reply.status_code == 200, reply.text
    assert [c["index"] for c in reply.json()["choices"]] == [0, 1]


def test_streaming_sends_one_chunk_per_committed_block(stack):
    with stack.stream(
        "POST",
        "/v1/completions",
        json={
            "model": "tiny",
            "prompt": "count from 1 to 5 .",
            "max_tokens": 4 * BLOCK,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    usage, final = chunks[-1], chunks[-2]  # include_usage: a last chunk with no choices, as OpenAI's
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] > 0
    assert final["choices"][0]["finish_reason"] in ("stop", "length") and "usage" not in final
    blocks = -(-usage["usage"]["completion_tokens"] // BLOCK)
    assert blocks >= 2, "the prompt should need several blocks"
    text_chunks = [c for c in chunks[:-2] if c["choices"][0]["text"]]
    assert 2 <= len(text_chunks) <= blocks  # a chunk per committed block, not one at the end
    streamed = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    whole = completion(stack, "count from 1 to 5 .", max_tokens=4 * BLOCK).json()["choices"][0]["text"]
    assert streamed == whole  # greedy decoding: the stream carries exactly the non-streamed text


def test_the_official_openai_client_works_unchanged(stack):
    client = openai.OpenAI(base_url=str(stack.base_url) + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["tiny"]
    text = client.completions.create(model="tiny", prompt="letters from a to d .", max_tokens=8)
    assert text.usage.completion_tokens >= 1
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "copy : cat ."}], max_tokens=8
    )
    assert chat.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=16, stream=True
    )
    finishes = [c.choices[0].finish_reason for c in stream if c.choices]
    assert finishes[-1] in ("stop", "length")
    extra = client.completions.create(model="tiny", prompt="a", max_tokens=8, extra_body={"threshold": 0.5})
    assert extra.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    "payload, status, needle",
    [
        ({"model": "tiny", "prompt": "hi", "max_tokens": 1000}, 400, "max_tokens"),
        ({"model": "other", "prompt": "hi"}, 404, "does not exist"),
        ({"model": "tiny", "prompt": "hi", "block_length": 64}, 400, "block_length"),
        ({"model": "tiny", "prompt": "hi", "steps": 3}, 400, "steps"),
        ({"model": "tiny", "prompt": "hi", "threshold": 2}, 400, "threshold"),
        ({"model": "tiny", "prompt": "hi " * 20000}, 400, "maximum context length"),
        ({"model": "tiny", "prompt": [99999]}, 400, "token ids"),
        ({"model": "tiny"}, 400, "prompt"),
        ({"model": "tiny", "prompt": "a", "n": 17}, 400, "n"),
        ({"model": "tiny", "prompt": "a", "temperature": 3}, 400, "temperature"),
    ],
)
def test_bad_requests_get_a_clear_4xx(stack, payload, status, needle):
    reply = stack.post("/v1/completions", json=payload)
    assert reply.status_code == status, reply.text
    assert needle in reply.json()["error"]["message"]


def test_metrics_and_health(stack):
    completion(stack, "a")
    assert stack.get("/healthz").status_code == 200
    for path in ("/nowhere-1", "/nowhere-2", "/v1/files/file-x/nothing"):
        assert stack.get(path).status_code == 404
    metrics = stack.get("/metrics").text
    assert "dllm_queue_depth" in metrics
    assert 'dllm_gateway_requests_total{endpoint="/v1/completions",status="200"} 1.0' in metrics
    assert 'endpoint="/healthz"' in metrics
    unmatched = [
        line
        for line in metrics.splitlines()
        if line.startswith('dllm_gateway_requests_total{endpoint="unmatched"')
    ]
    assert len(unmatched) == 1 and unmatched[0].endswith(" 3.0")  # one series, whatever the URLs
    assert "nowhere" not in metrics


def test_api_keys_and_queue_limit(served_model, redis_server, service):
    settings = gateway_settings(served_model, redis_server.url, service, api_keys=("sekret",), max_queued=2)
    with GatewayServer(settings) as gateway, httpx.Client(base_url=gateway.url, timeout=10) as client:
        assert completion(client, "a").status_code == 401
        auth = {"Authorization": "Bearer sekret"}
        assert client.get("/v1/models", headers=auth).status_code == 200
        # no worker is running: two queued requests fill the queue, the next is refused with Retry-After
        queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
        for index in range(2):
            queue.run(
                queue.ops.enqueue(
                    QueuedRequest(f"r-{index}", [1, 2], RequestParams(max_tokens=8), time.time()), 0
                )
            )
        refused = client.post(
            "/v1/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 8}, headers=auth
        )
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.json()["error"]["type"] == "rate_limit_error"


def test_metrics_need_the_key_and_docs_can_be_switched_off(served_model, redis_server, service):
    settings = gateway_settings(served_model, redis_server.url, service, api_keys=("sekret",), docs=False)
    with GatewayServer(settings) as gateway, httpx.Client(base_url=gateway.url, timeout=10) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer sekret"}).status_code == 200
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert client.get(path).status_code == 404, path


def test_metrics_on_a_port_of_their_own_need_no_key(served_model, redis_server, service):
    """What the operator's ServiceMonitor scrapes: the metrics port, never the API port."""
    port = free_port()
    settings = gateway_settings(
        served_model,
        redis_server.url,
        service,
        api_keys=("sekret",),
        metrics_port=port,
        metrics_host="127.0.0.1",
    )
    with GatewayServer(settings) as gateway, httpx.Client(base_url=gateway.url, timeout=10) as client:
        auth = {"Authorization": "Bearer sekret"}
        assert client.get("/metrics", headers=auth).status_code == 404
        assert client.get("/v1/models", headers=auth).status_code == 200
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert scraped.status_code == 200 and "dllm_gateway_requests_total" in scraped.text
        assert 'endpoint="/v1/models"' in scraped.text
    with pytest.raises(httpx.ConnectError):  # stopped with the gateway
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_boolean_settings_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("DLLM_DOCS", "false")
    assert GatewaySettings.from_env().docs is False
    monkeypatch.setenv("DLLM_DOCS", "maybe")
    with pytest.raises(SettingsError, match="DLLM_DOCS"):
        GatewaySettings.from_env()


def test_gateway_does_not_import_torch():
    code = "import sys, gateway.app, gateway.__main__; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_each_request_decodes_with_its_own_threshold(stack, served_model):
    """A per-request threshold must reach the worker: the served text equals the request generated
    alone at that threshold, and two thresholds give different texts (so the check has teeth)."""
    from engine_pod.decoding.config import DecodingConfig
    from engine_pod.generation import generate_one
    from engine_pod.loading.loader import load_model
    from gateway.tokenizer import GatewayTokenizer

    loaded, tokenizer = load_model(str(served_model)), GatewayTokenizer(str(served_model))
    prompt, texts = "letters from a to k .", {}
    for threshold in (0.01, 1.0):
        reply = completion(stack, prompt, max_tokens=3 * BLOCK, threshold=threshold)
        assert reply.status_code == 200, reply.text
        texts[threshold] = reply.json()["choices"][0]["text"]
        decoding = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK, threshold=threshold)
        alone = generate_one(loaded, tokenizer.encode(prompt), 3 * BLOCK, decoding)
        assert texts[threshold] == tokenizer.decode(alone.token_ids), threshold
    assert texts[0.01] != texts[1.0]


def test_a_stream_that_fails_in_the_worker_ends_with_an_error_event_and_done(
    served_model, redis_server, service, make_worker
):
    """150 prompt tokens + 64 to generate cannot fit a budget of 200: the worker rejects it after the
    stream has started, so the error must come as an event, followed by [DONE]."""
    with (
        GatewayServer(gateway_settings(served_model, redis_server.url, service)) as gateway,
        make_worker(redis_server.url, service, token_budget=200),
        httpx.Client(base_url=gateway.url, timeout=60) as client,
        client.stream(
            "POST",
            "/v1/completions",
            json={"model": "tiny", "prompt": [5] * 150, "max_tokens": 64, "stream": True},
        ) as response,
    ):
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert "token budget" in error["message"] and error["type"] == "invalid_request_error"


def test_a_multi_prompt_call_is_bounded_and_enqueued_whole_or_not_at_all(served_model, redis_server, service):
    settings = gateway_settings(
        served_model, redis_server.url, service, max_queued=4, max_prompts_per_request=8
    )
    client = redis.Redis.from_url(redis_server.url)
    pending = ServiceKeys(service).pending
    with GatewayServer(settings) as gateway, httpx.Client(base_url=gateway.url, timeout=60) as http:
        too_many = completion(http, ["hi"] * 9, max_tokens=8)
        assert too_many.status_code == 400 and "at most 8" in too_many.json()["error"]["message"]
        over_capacity = completion(http, ["hi"] * 5, max_tokens=8)  # no worker: the queue holds them
        assert over_capacity.status_code == 429, over_capacity.text
        assert client.zcard(pending) == 0, "a refused call must leave nothing queued"


def test_a_redis_outage_makes_the_gateway_unready_not_dead(served_model, service):
    from engine_pod.serve.redis_server import RedisServer

    server = RedisServer().start()
    try:
        with GatewayServer(gateway_settings(served_model, server.url, service)) as gateway:
            assert httpx.get(f"{gateway.url}/readyz").status_code == 200
            server.kill()
            assert httpx.get(f"{gateway.url}/healthz").status_code == 200  # liveness: do not restart it
            assert httpx.get(f"{gateway.url}/readyz", timeout=30).status_code == 503
    finally:
        server.stop()


def test_gateway_settings_round_trip_through_their_environment(monkeypatch):
    """One contract: what the operator, dllm serve and the benchmark render is what the gateway reads."""
    from gateway.settings import ENV_NAMES, GatewaySettings

    settings = GatewaySettings(
        service="svc-1", model_dir="/m", api_keys=("a", "b"), max_queued=7, threshold=0.75, result_ttl_s=60
    )
    for variable in ENV_NAMES.values():
        monkeypatch.delenv(variable, raising=False)
    for variable, value in settings.to_env().items():
        monkeypatch.setenv(variable, value)
    assert GatewaySettings.from_env() == settings
    assert set(settings.to_env(exclude=("api_keys",))) == set(ENV_NAMES.values()) - {"DLLM_API_KEYS"}


def test_a_bug_on_the_fast_path_is_a_500_in_openais_shape_and_counted(
    served_model, redis_server, service, monkeypatch
):
    from gateway import fast_path

    def broken(body, state, is_disconnected):
        raise RuntimeError("a bug")

    model, _ = fast_path.ROUTES["/v1/completions"]
    monkeypatch.setitem(fast_path.ROUTES, "/v1/completions", (model, broken))
    settings = gateway_settings(served_model, redis_server.url, service)
    with GatewayServer(settings) as gateway, httpx.Client(base_url=gateway.url, timeout=10) as client:
        reply = completion(client, "count to 3 .")
        assert reply.status_code == 500
        assert reply.json()["error"]["type"] == "server_error"
        metrics = client.get("/metrics").text
    assert 'dllm_gateway_requests_total{endpoint="/v1/completions",status="500"} 1.0' in metrics
