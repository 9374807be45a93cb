"""A Redis that wants a password: ``dllm worker`` and ``python -m gateway`` take it from ``$REDIS_PASSWORD``
(what the operator injects from ``spec.redis.passwordSecretRef``) when the URL carries none."""

from __future__ import annotations

import signal

import httpx
import pytest
import redis

from dllm_contracts.queue.connect import REDIS_PASSWORD_ENV, sync_client
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import RedisServer, free_port
from tests.serving_utils import BLOCK, completion, start_worker_process, wait_for

PASSWORD = "s3cret-for-this-test"


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False


def test_worker_and_gateway_authenticate_with_the_password_from_the_environment(
    served_model, service, tmp_path, monkeypatch
):
    with RedisServer(extra_args=["--requirepass", PASSWORD]) as server:
        with pytest.raises(redis.AuthenticationError):
            sync_client(server.url).ping()  # without it there is no way in
        monkeypatch.setenv(REDIS_PASSWORD_ENV, PASSWORD)
        assert sync_client(server.url).ping()
        monkeypatch.delenv(REDIS_PASSWORD_ENV)
        env = {
            "DLLM_REDIS_URL": server.url,
            "DLLM_SERVICE": service,
            "DLLM_MODEL_DIR": str(served_model),
            "DLLM_MODEL_NAME": "tiny",
            "DLLM_BLOCK_LENGTH": str(BLOCK),
            "DLLM_STEPS_PER_BLOCK": str(BLOCK),
            REDIS_PASSWORD_ENV: PASSWORD,
        }
        gateway = GatewayProcess("127.0.0.1", free_port(), env).start()
        worker = start_worker_process(
            served_model, server.url, service, log=tmp_path / "worker.log", env={REDIS_PASSWORD_ENV: PASSWORD}
        )
        try:
            with httpx.Client(base_url=gateway.url, timeout=60) as client:
                wait_for(lambda: _ready(client), what="the gateway to reach Redis")
                reply = completion(client, "copy : cat dog .", max_tokens=8)
                assert reply.status_code == 200, reply.text
                assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
            gateway.stop()
        assert worker.returncode == 0, (tmp_path / "worker.log").read_text()[-2000:]
