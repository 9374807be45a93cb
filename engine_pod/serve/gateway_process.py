"""Run the gateway (``python -m gateway``) as a child process and wait until it answers."""

from __future__ import annotations

import sys

from engine_pod.serve.child_process import ProbedProcess
from gateway.processes import SUPERVISED_FLAG


class GatewayProcess(ProbedProcess):
    name = "gateway"
    starting = "starting the gateway"

    def __init__(
        self,
        host: str,
        port: int,
        env: dict[str, str],
        popen_options: dict | None = None,
        stop_s: float = 10.0,
        log_level: str = "warning",
    ) -> None:
        self.host, self.port = host, port
        argv = [sys.executable, "-m", "gateway", "--host", host, "--port", str(port)]
        argv += ["--log-level", log_level, SUPERVISED_FLAG]
        super().__init__(argv, f"{self.url}/healthz", env, popen_options, stop_s)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
