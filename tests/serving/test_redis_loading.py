"""``dllm worker`` and ``python -m gateway`` on their own, started while their Redis reads its append-only file
back (it answers LOADING to every command that touches data until it is done): neither ends nor serves as if
the queue were there; both say they are not ready until Redis has loaded, then serve. (``dllm serve``'s own
starts and Redis restarts: test_serve_restarts.py.)"""

from __future__ import annotations

import contextlib
import threading

import httpx
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import RedisServer, free_port
from engine_pod.serve.worker_process import WorkerProcess
from tests.serving.slow_redis import fill_append_only_file, slow_loading_args
from tests.serving_utils import gateway_settings, wait_for, worker_command


def _loading(port: int) -> bool | None:
    """Whether the Redis on ``port`` is loading its data (None: it does not answer yet)."""
    try:
        client = redis.Redis(port=port, retry=Retry(NoBackoff(), 0))
        return bool(int(client.info("persistence")["loading"]))
    except (redis.ConnectionError, redis.TimeoutError):
        return None


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return 0


def _start_until_killed(server: RedisServer) -> None:
    """``server.start()``, which returns once Redis has loaded its data, or raises once it was killed."""
    with contextlib.suppress(RuntimeError):
        server.start()


def test_a_worker_and_a_gateway_started_while_redis_loads_wait_for_it_then_serve(
    served_model, service, tmp_path
):
    """Started while Redis loads (made to take minutes): up, not ready, a request answered 503 and not queued.
    Redis then restarts on the same file and loads it: both serve, without a restart of their own."""
    data = tmp_path / "redis"
    data.mkdir()
    fill_append_only_file(data, 60_000, value_bytes=100)  # a minute to load, at 1 ms a key
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    slow = RedisServer(port=port, data_dir=str(data), appendonly=True, extra_args=slow_loading_args(1000))
    threading.Thread(target=_start_until_killed, args=(slow,), daemon=True).start()
    settings = gateway_settings(served_model, url, service, enqueue_timeout_s=2)
    worker_probes, gateway, worker, fast = free_port(), None, None, None
    try:
        wait_for(lambda: _loading(port), what="Redis loading its data")
        gateway = GatewayProcess("127.0.0.1", free_port(), settings.to_env()).start()  # /healthz answers
        worker = WorkerProcess(
            worker_command(served_model, url, service)[4:], worker_probes
        ).start()  # /startupz
        body = {"model": "tiny", "prompt": "count to 5 .", "max_tokens": 8}
        while_loading = httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=120)
        unready = [_status(f"{gateway.url}/readyz"), _status(f"http://127.0.0.1:{worker_probes}/readyz")]
        assert _loading(port), "Redis must still be loading: the checks above ran while it loaded"
        slow.kill()
        fast = RedisServer(port=port, data_dir=str(data), appendonly=True).start()  # loaded when it returns
        wait_for(lambda: _status(f"http://127.0.0.1:{worker_probes}/readyz") == 200, what="the worker ready")
        wait_for(lambda: _status(f"{gateway.url}/readyz") == 200, what="the gateway ready")
        reply = httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=120)
        alive = gateway.process.poll() is None and worker.process.poll() is None
    finally:
        for child in (worker, gateway, fast, slow):
            if child is not None:
                child.stop()
    assert while_loading.status_code == 503 and while_loading.headers.get("retry-after"), while_loading.text
    assert unready == [503, 503]
    assert reply.status_code == 200, reply.text
    assert alive
