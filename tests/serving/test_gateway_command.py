"""``python -m gateway`` as users run it: its ``--help`` lists every variable it reads, a missing required
one is named in one line, and ``DLLM_MODEL_DIR`` takes the models ``dllm serve`` takes (``builtin:NAME``,
``random:PRESET``), answered through a real Redis."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

from engine_pod.bench.gateway_cost import InstantPeer
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import free_port
from gateway.settings import ENV_NAMES, GatewaySettings

START_S = 120


def _gateway(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DLLM_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=START_S,
    )


def test_help_lists_every_variable_the_gateway_reads_with_its_default():
    done = _gateway("--help", env={})
    assert done.returncode == 0, done.stderr
    for variable in ENV_NAMES.values():
        assert variable in done.stdout, variable
    assert f"DLLM_MAX_QUEUED={GatewaySettings.max_queued}" in done.stdout
    assert "DLLM_MODEL_DIR (required)" in done.stdout and "builtin:NAME" in done.stdout
    assert "REDIS_PASSWORD" in done.stdout


def test_a_missing_model_is_named_in_one_line():
    done = _gateway("--host", "127.0.0.1", "--port", str(free_port()), env={})
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gateway: error: DLLM_MODEL_DIR is not set"), done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_builtin_model_is_refused_in_one_line():
    done = _gateway("--host", "127.0.0.1", "--port", str(free_port()), env={"DLLM_MODEL_DIR": "builtin:nope"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("gateway: error: no built-in model 'nope'")


@pytest.mark.parametrize(
    "spec, served", [("builtin:tiny-llada", "tiny-llada"), ("random:llada-tiny", "llada-tiny")]
)
def test_the_gateway_serves_a_model_named_as_dllm_serve_takes_it(redis_server, service, spec, served):
    peer = InstantPeer(redis_server.url, 32, service)
    peer.start()
    env = {"DLLM_MODEL_DIR": spec, "DLLM_REDIS_URL": redis_server.url, "DLLM_SERVICE": service}
    gateway = GatewayProcess("127.0.0.1", free_port(), env).start()
    try:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", http_client=httpx.Client())
        assert [model.id for model in client.models.list()] == [served]
        reply = client.completions.create(model=served, prompt="count to 3 .", max_tokens=32)
        assert reply.usage.completion_tokens == 32 and reply.model == served
    finally:
        gateway.stop()
        peer.halt.set()
