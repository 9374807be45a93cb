"""A child process that is up once an HTTP health URL answers 200, and stops with SIGTERM, then SIGKILL."""

from __future__ import annotations

import os
import subprocess
import time

import httpx


class ProbedProcess:
    """``start()`` runs ``argv`` and returns once ``health_url`` answers; ``stop()`` waits ``stop_s``
    after SIGTERM (the child's own drain) before it kills."""

    name = "process"
    start_timeout_s = 60.0  # how long ``start()`` waits for the health URL

    def __init__(
        self,
        argv: list[str],
        health_url: str,
        env: dict[str, str] | None = None,
        popen_options: dict | None = None,
        stop_s: float = 10.0,
    ) -> None:
        self.argv, self.health_url, self.env = argv, health_url, env or {}
        self.popen_options = popen_options or {}
        self.stop_s = stop_s
        self.process: subprocess.Popen | None = None

    def start(self) -> ProbedProcess:
        self.process = subprocess.Popen(self.argv, env=os.environ | self.env, **self.popen_options)
        timeout_s = self.start_timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the {self.name} exited with status {self.process.returncode} (see its output)"
                )
            try:
                if httpx.get(self.health_url, timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the {self.name} did not answer on {self.health_url} within {timeout_s:.0f} s")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the child if it runs."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.stop_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
