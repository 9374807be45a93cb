"""The gateway's one door, as ``python -m gateway`` serves it with a real ``dllm worker`` behind it, probed
from outside with raw sockets: clients that leave, ambiguous keys, trusted proxies, heads too large or too
slow."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
import redis

from dllm_contracts.queue.messages import DoneEvent
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from engine_pod.serve.redis_server import RedisServer
from tests.serving_utils import BLOCK, WAIT_S, RawReplies, logging_gateway, start_worker_process, wait_for

KEY = "key-of-the-door"
SERVICE = "door"
MAX_TOKENS = 512  # what the gateway allows: a generation that runs for many blocks unless cancelled
HEADER_LIMIT = 4096
HEADER_TIMEOUT_S = 1


@pytest.fixture(scope="module")
def door(served_model, tmp_path_factory):
    """(gateway, queue, log): ``python -m gateway`` (keys on, access log on, small head limits) and a
    worker that ignores EOS, so that only a cancellation ends a generation before ``MAX_TOKENS``."""
    server = RedisServer().start()
    logs = tmp_path_factory.mktemp("door")
    worker = start_worker_process(served_model, server.url, SERVICE, "--ignore-eos", log=logs / "worker.log")
    env = {
        "DLLM_REDIS_URL": server.url,
        "DLLM_SERVICE": SERVICE,
        "DLLM_MODEL_DIR": str(served_model),
        "DLLM_MODEL_NAME": "tiny",
        "DLLM_API_KEYS": KEY,
        "DLLM_BLOCK_LENGTH": str(BLOCK),
        "DLLM_STEPS_PER_BLOCK": str(BLOCK),
        "DLLM_MAX_TOKENS": str(MAX_TOKENS),
        "DLLM_MAX_HEADER_BYTES": str(HEADER_LIMIT),
        "DLLM_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "DLLM_FORWARDED_ALLOW_IPS": "127.0.0.1",
    }
    log = logs / "gateway.log"
    sink = log.open("w")
    gateway = logging_gateway(env, sink)
    try:
        gateway.start()
        yield gateway, SyncQueue(redis.Redis.from_url(server.url), QueueOps(SERVICE)), log
    finally:
        gateway.stop()
        sink.close()
        worker.terminate()
        worker.wait(timeout=WAIT_S)
        server.stop()


def _head(path: str, length: int | None, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *headers]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _request(body: dict, *headers: str, path: str = "/v1/completions") -> bytes:
    raw = json.dumps(body).encode()
    return _head(path, len(raw), *headers) + raw


def _stream_body() -> dict:
    return {"model": "tiny", "prompt": "copy : cat dog .", "max_tokens": MAX_TOKENS, "stream": True}


def _connect(gateway) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT_S)


def _request_ids(queue: SyncQueue) -> set[str]:
    prefix = queue.ops.keys.request("")
    return {key.decode()[len(prefix) :] for key in queue.redis.scan_iter(match=prefix + "*")}


def _done(queue: SyncQueue, request_id: str) -> DoneEvent | None:
    return next((e for e in queue.events_of(request_id) if isinstance(e, DoneEvent)), None)


def _metrics(gateway) -> str:
    reply = httpx.get(f"{gateway.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT_S)
    return reply.text


def _leave_after_head(sock: socket.socket) -> None:
    replies = RawReplies(sock)
    while b"\r\n\r\n" not in replies.buffer:
        assert replies._fill(), "the connection closed before the response head"
    assert replies.buffer.startswith(b"HTTP/1.1 200")


def _leave_after_first_event(sock: socket.socket) -> None:
    replies = RawReplies(sock)
    while b"data: " not in replies.buffer:
        assert replies._fill(), "the connection closed before the first event"


@pytest.mark.parametrize(
    "leave", [None, _leave_after_head, _leave_after_first_event], ids=["at-once", "head", "event"]
)
def test_a_stream_whose_client_leaves_at_any_moment_is_cancelled_in_the_worker(door, leave):
    """The client sends a streamed request and closes (at once, after the head, after the first event):
    the request's done event says ``cancelled``; it is not generated to its ``max_tokens``."""
    gateway, queue, _ = door
    before = _request_ids(queue)
    with _connect(gateway) as sock:
        sock.sendall(_request(_stream_body(), f"Authorization: Bearer {KEY}"))
        if leave is not None:
            leave(sock)
    (request_id,) = wait_for(lambda: _request_ids(queue) - before, what="the request in the queue")
    done = wait_for(lambda: _done(queue, request_id), what="the request's done event")
    assert done.finish_reason == "cancelled", done
    assert len(done.token_ids) < MAX_TOKENS


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/models"])
def test_more_than_one_authorization_header_is_a_400(door, path):
    """Whichever header holds the key, two of them are refused (proxies and servers disagree on which one
    counts), on the completion endpoints and on the others."""
    gateway, _, _ = door
    body = {"model": "tiny", "prompt": "hi", "max_tokens": BLOCK}
    for keys in (("not-a-key", KEY), (KEY, "not-a-key")):
        headers = [f"Authorization: Bearer {key}" for key in keys]
        request = _request(body, *headers, path=path)
        if path == "/v1/models":
            request = request.replace(b"POST ", b"GET ", 1)
        with _connect(gateway) as sock:
            sock.sendall(request)
            status, _, reply = RawReplies(sock).next()
        assert status == 400, reply
        error = json.loads(reply)["error"]
        assert error["type"] == "invalid_request_error" and "Authorization" in error["message"]


def test_a_client_leaving_in_the_middle_of_a_chunked_body_is_no_server_error(door):
    gateway, _, log = door
    with _connect(gateway) as sock:
        head = _head("/v1/completions", None, f"Authorization: Bearer {KEY}", "Transfer-Encoding: chunked")
        sock.sendall(
            head + b"40\r\n" + b'{"model": "tiny", "prompt": "copy'
        )  # 64 bytes announced, fewer sent
    left = 'dllm_gateway_requests_total{endpoint="/v1/completions",status="499"}'
    metrics = wait_for(lambda: left in (text := _metrics(gateway)) and text, what="the request counted")
    assert 'status="500"' not in metrics
    text = log.read_text()
    assert "Traceback" not in text and "Exception" not in text, text[-3000:]


def test_the_access_log_shows_the_client_a_trusted_proxy_forwards(door):
    """The proxy (127.0.0.1, trusted by DLLM_FORWARDED_ALLOW_IPS) says who the client is; the access log
    line shows that client and the query string."""
    gateway, _, log = door
    body = {"model": "tiny", "prompt": "hi", "max_tokens": BLOCK}
    request = _request(
        body, f"Authorization: Bearer {KEY}", "X-Forwarded-For: 203.0.113.7", path="/v1/completions?trace=on"
    )
    with _connect(gateway) as sock:
        sock.sendall(request)
        status, _, _ = RawReplies(sock).next()
    assert status == 200
    line = '203.0.113.7:0 - "POST /v1/completions?trace=on HTTP/1.1" 200'
    wait_for(
        lambda: line in log.read_text(), what="the access log line", seen=lambda: log.read_text()[-1500:]
    )


@pytest.mark.parametrize("finished", [True, False], ids=["complete", "never-ending"])
def test_a_head_over_the_limit_is_a_431_and_the_connection_closes(door, finished):
    """A header larger than DLLM_MAX_HEADER_BYTES, whole or still arriving, is answered at once."""
    gateway, _, _ = door
    big = "X-Padding: " + "a" * (2 * HEADER_LIMIT)
    request = _request({"model": "tiny", "prompt": "hi"}, f"Authorization: Bearer {KEY}", big)
    if not finished:
        request = request[: request.index(b"X-Padding") + len(big)]  # the header never ends
    with _connect(gateway) as sock:
        sock.sendall(request)
        replies = RawReplies(sock)
        status, headers, reply = replies.next()
        assert status == 431 and headers["connection"] == "close"
        assert str(HEADER_LIMIT) in json.loads(reply)["error"]["message"]
        assert replies.closed()


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"])
def test_a_head_not_in_within_the_time_limit_has_its_connection_closed(door, sent):
    """A connection that sends nothing, or a head it never finishes, is closed after
    DLLM_HEADER_TIMEOUT_S; a head that arrives in time on a kept-alive connection is answered."""
    gateway, _, _ = door
    with _connect(gateway) as sock:
        sock.sendall(sent)
        assert RawReplies(sock).closed()
    with _connect(gateway) as sock:
        sock.sendall(
            _request({"model": "tiny", "prompt": "hi", "max_tokens": BLOCK}, f"Authorization: Bearer {KEY}")
        )
        status, _, _ = RawReplies(sock).next()
        assert status == 200
