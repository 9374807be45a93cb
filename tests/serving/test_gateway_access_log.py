"""``python -m gateway`` writes uvicorn's access log (a line per request) unless DLLM_ACCESS_LOG=false."""

from __future__ import annotations

import pytest

from engine_pod.serve.redis_server import free_port
from tests.serving_utils import logging_gateway


@pytest.mark.parametrize("setting, logged", [(None, True), ("false", False)])
def test_the_access_log_follows_its_setting(served_model, tmp_path, setting, logged):
    env = {"DLLM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "DLLM_MODEL_DIR": str(served_model)}
    if setting is not None:
        env["DLLM_ACCESS_LOG"] = setting
    log = tmp_path / "gateway.log"
    with log.open("w") as sink:
        gateway = logging_gateway(env, sink)
        gateway.start()  # returns once /healthz answered 200: that request is in the log, or not
        gateway.stop()
    text = log.read_text()
    assert "Application startup complete" in text, text[-2000:]  # the log is the gateway's
    assert ('"GET /healthz HTTP/1.1" 200' in text) == logged, text[-2000:]
