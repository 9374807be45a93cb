"""The gateway's HTTP on a real socket, as ``python -m gateway`` serves it: the two completion endpoints
(the fast path) and everything else (the FastAPI application) on the same connections, as HTTP/1.1 says."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from engine_pod.bench.gateway_cost import InstantPeer
from engine_pod.serve.redis_server import RedisServer, free_port
from tests.serving_utils import WAIT_S, GatewayServer, RawReplies, gateway_settings, wait_for

TOKENS = 32  # what the instant peer answers (one block of its 32)


@pytest.fixture(scope="module")
def stack(served_model):
    """A gateway (as ``python -m gateway`` serves it) whose requests an instant peer answers."""
    server = RedisServer().start()
    peer = InstantPeer(server.url, TOKENS, "http")
    peer.start()
    try:
        settings = gateway_settings(served_model, server.url, "http", max_tokens_limit=TOKENS)
        with GatewayServer(settings) as gateway:
            yield gateway
    finally:
        peer.halt.set()
        server.stop()


def _request(
    path: str, body: bytes = b"", method: str = "POST", version: str = "1.1", extra: str = ""
) -> bytes:
    head = f"{method} {path} HTTP/{version}\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}"
    if method == "POST" and "Transfer-Encoding" not in extra:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _completion(max_tokens: int = TOKENS, **fields) -> bytes:
    return json.dumps(
        {"model": "tiny", "prompt": "copy : cat dog .", "max_tokens": max_tokens} | fields
    ).encode()


def _connect(gateway: GatewayServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT_S)


def test_pipelined_requests_of_both_kinds_are_answered_in_order_on_one_connection(stack):
    """A completion, a request for the ASGI application, a streamed chat and another completion, sent in
    one write: each answered in turn, keep-alive throughout."""
    chat = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    with _connect(stack) as sock:
        sock.sendall(
            _request("/v1/completions", _completion())
            + _request("/v1/models", method="GET")
            + _request("/v1/chat/completions", chat.encode())
            + _request("/v1/completions", _completion(TOKENS, echo=True))
        )
        replies = RawReplies(sock)
        answers = [replies.next() for _ in range(4)]
    assert [status for status, _, _ in answers] == [200] * 4
    first, models, streamed, last = (body for _, _, body in answers)
    assert not json.loads(first)["choices"][0]["text"].startswith("copy")  # not echoed: the first one
    assert json.loads(models)["data"][0]["id"] == "tiny"
    events = [line.removeprefix("data: ") for line in streamed.decode().split("\n\n") if line]
    assert events[-1] == "[DONE]" and json.loads(events[0])["object"] == "chat.completion.chunk"
    assert json.loads(last)["choices"][0]["text"].startswith("copy : cat dog .")
    assert all(headers.get("connection") != "close" for _, headers, _ in answers)


def test_a_chunked_body_gets_the_answer_a_declared_one_gets(stack):
    """No Content-Length: the body is counted as it arrives (the body limit); the answer is the one a
    declared body gets."""
    body = _completion()
    with httpx.Client(base_url=stack.url, timeout=WAIT_S) as client:
        declared = client.post("/v1/completions", content=body).json()
        chunked = client.post("/v1/completions", content=iter([body[:10], body[10:]])).json()
    assert chunked["object"] == declared["object"] == "text_completion"
    assert chunked["choices"][0]["text"] == declared["choices"][0]["text"]
    assert chunked["usage"] == declared["usage"]
    assert chunked["id"] != declared["id"]


@pytest.mark.parametrize("ending", ["Connection: close", "HTTP/1.0"])
def test_a_client_that_asks_for_it_gets_its_connection_closed_after_the_answer(stack, ending):
    version, extra = ("1.0", "") if ending == "HTTP/1.0" else ("1.1", "Connection: close\r\n")
    with _connect(stack) as sock:
        sock.sendall(_request("/v1/completions", _completion(), version=version, extra=extra))
        replies = RawReplies(sock)
        status, headers, body = replies.next()
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == TOKENS
        assert headers["connection"] == "close"
        assert replies.closed()


def test_a_body_cut_short_by_a_client_that_leaves_is_not_answered_and_the_gateway_goes_on(stack):
    with _connect(stack) as sock:
        sock.sendall(_request("/v1/completions", _completion())[:-10])  # ten bytes of the body missing
    with httpx.Client(base_url=stack.url, timeout=WAIT_S) as client:
        assert client.post("/v1/completions", content=_completion()).status_code == 200
        metrics = client.get("/metrics").text
    assert 'dllm_gateway_requests_total{endpoint="/v1/completions",status="200"}' in metrics


def test_a_request_still_being_enqueued_when_the_drain_runs_out_is_told_to_retry(served_model):
    """Redis away (the enqueue retries for a minute) and SIGTERM with no drain time: when the server
    gives up on the request it answers 503 with Retry-After, not a cut connection or a bare 500."""
    settings = gateway_settings(
        served_model,
        f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        "http",
        enqueue_timeout_s=60,
        drain_timeout_s=0,
        retry_after_s=7,
    )
    with GatewayServer(settings) as gateway:
        replies = []
        client = threading.Thread(
            target=lambda: replies.append(
                httpx.post(f"{gateway.url}/v1/completions", content=_completion(), timeout=WAIT_S)
            )
        )
        client.start()
        wait_for(lambda: gateway.server.server_state.tasks, what="the request to be in the gateway")
        gateway.terminate()
        client.join(timeout=WAIT_S)
    assert replies, "no answer"
    reply = replies[0]
    assert reply.status_code == 503 and reply.headers["retry-after"] == "7"
    assert reply.json()["error"]["message"] == "the gateway is shutting down; retry the request"
