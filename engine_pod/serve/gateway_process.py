"""Run the gateway (``python -m gateway``) as a child process and wait until it answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx


class GatewayProcess:
    def __init__(self, host: str, port: int, env: dict[str, str]) -> None:
        self.host, self.port, self.env = host, port, env
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> GatewayProcess:
        command = [sys.executable, "-m", "gateway", "--host", self.host, "--port", str(self.port)]
        self.process = subprocess.Popen(command, env=os.environ | self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the gateway exited with status {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the gateway did not answer on {self.url} within {timeout_s} s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
