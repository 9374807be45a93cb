"""``python -m gateway`` with DLLM_GATEWAY_PROCESSES=2: two processes on one port, both answering, all of
them stopped by one SIGTERM (and by the parent's death), a taken port refused in one line."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx

from engine_pod.bench.gateway_cost import InstantPeer
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import free_port
from gateway.settings import GatewaySettings
from tests.serving_utils import WAIT_S, logging_gateway, wait_for

START_S = max(WAIT_S, 120)  # a slow machine starting two gateway processes


def _settings(redis_url: str, model: Path, service: str) -> GatewaySettings:
    return GatewaySettings(
        redis_url=redis_url, service=service, model_dir=str(model), model_name="m", processes=2
    )


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_two_processes_share_the_port_and_stop_together(served_model, redis_server, service, tmp_path):
    peer = InstantPeer(redis_server.url, 32, service)
    peer.start()
    log = tmp_path / "gateway.log"
    env = _settings(redis_server.url, served_model, service).to_env()
    try:
        with log.open("w") as sink:
            gateway = logging_gateway(env, sink).start()
            wait_for(lambda: len(_children(gateway.process.pid)) == 2, START_S, what="two gateway processes")
            children = _children(gateway.process.pid)
            wait_for(
                lambda: log.read_text().count("Application startup complete") == 2, START_S, what="both up"
            )
            body = {"model": "m", "prompt": "count to 9 .", "max_tokens": 32}
            for _ in range(40):  # a connection each: the kernel spreads new connections over the processes
                with httpx.Client(base_url=gateway.url, timeout=60) as client:
                    reply = client.post("/v1/completions", json=body)
                    assert reply.status_code == 200, reply.text
                    assert reply.json()["usage"]["completion_tokens"] == 32
            gateway.process.send_signal(signal.SIGTERM)
            assert gateway.process.wait(timeout=START_S) == 0
            wait_for(lambda: not any(_alive(child) for child in children), START_S, what="children stopped")
    finally:
        peer.halt.set()
    served = Counter(re.findall(r"\[(\d)\] [\d.:]+ - \"POST /v1/completions", log.read_text()))
    assert set(served) == {"0", "1"} and sum(served.values()) == 40, served


def test_the_children_stop_when_their_parent_is_killed(served_model, redis_server, service):
    env = _settings(redis_server.url, served_model, service).to_env()
    gateway = GatewayProcess("127.0.0.1", free_port(), env, {"stdout": subprocess.DEVNULL}).start()
    wait_for(lambda: len(_children(gateway.process.pid)) == 2, START_S, what="two gateway processes")
    children = _children(gateway.process.pid)
    gateway.process.kill()
    gateway.process.wait(timeout=START_S)
    wait_for(lambda: not any(_alive(child) for child in children), START_S, what="orphaned children stopped")


def test_a_taken_port_is_refused_in_one_line(served_model, redis_server, service):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = os.environ | _settings(redis_server.url, served_model, service).to_env()
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=START_S,
        )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"gateway: error: port {port} is in use"
