"""A worker started by hand as README shows (``dllm worker --redis URL --service NAME``) beside ``python -m
gateway`` on the same model labels its metrics with the model's name, as the gateway names it: one model
on the dashboard, not the model and the service."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from dllm_contracts.defaults import DEFAULT_MODEL_NAME
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import free_port
from gateway.settings import ENV_NAMES
from tests.serving_utils import WAIT_S, wait_for


def _model_labels(url: str) -> set[str]:
    """Every value of a ``model`` label on /metrics at ``url``, once a request was observed."""
    try:
        text = httpx.get(url, timeout=10).text
    except httpx.HTTPError:
        return set()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    observed = [s for s in samples if s.name == "dllm_queue_wait_seconds_count" and s.value > 0]
    return {s.labels["model"] for s in samples if "model" in s.labels} if observed else set()


def test_a_worker_started_by_hand_labels_its_metrics_with_the_gateways_model_name(
    redis_server, service, tmp_path
):
    port = free_port()
    argv = [sys.executable, "-m", "engine_pod.cli.main", "worker", "--redis", redis_server.url]
    argv += ["--service", service, "--port", str(port)]  # the model: --model's default, as README runs it
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 (closed below)
    worker = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"OMP_NUM_THREADS": "1"}
    )
    env = {
        ENV_NAMES["redis_url"]: redis_server.url,
        ENV_NAMES["service"]: service,
        ENV_NAMES["model_dir"]: DEFAULT_MODEL_NAME,  # the same model, as the gateway takes it
        ENV_NAMES["file_store"]: str(tmp_path / "files"),
    }
    gateway = GatewayProcess("127.0.0.1", free_port(), env).start()
    try:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=WAIT_S)
        model = client.models.list().data[0].id
        assert client.completions.create(model=model, prompt="count to 5 .", max_tokens=16).choices
        labels = wait_for(
            lambda: _model_labels(f"http://127.0.0.1:{port}/metrics"),
            what="the worker's metrics of the request",
            seen=lambda: (tmp_path / "worker.log").read_text()[-2000:],
        )
        assert labels == {model} and model != service, labels
    finally:
        gateway.stop()
        worker.terminate()
        worker.wait(timeout=WAIT_S)
        log.close()
