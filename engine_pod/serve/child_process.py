"""A child process that is up once an HTTP health URL answers 200, and stops with SIGTERM, then SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx


class ProbedProcess:
    """``start()`` runs ``argv`` and returns once ``health_url`` answers; ``stop()`` waits ``stop_s``
    after SIGTERM (the child's own drain) before it kills."""

    name = "process"
    starting = "starting"  # what ``start()`` does, as a line of progress says it
    start_timeout_s = 60.0  # how long ``start()`` waits for the health URL
    WAIT_STEP_S = 2.0  # how often ``stop()`` reports while the child drains

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
        self.last_line = ""  # the last line the child wrote to stderr: why it stopped, if it did

    def start(self) -> ProbedProcess:
        options = {"stderr": subprocess.PIPE} | self.popen_options  # a caller may send stderr elsewhere
        self.process = subprocess.Popen(self.argv, env=os.environ | self.env, **options)
        forwarder = threading.Thread(target=self._forward, args=(self.process.stderr,), daemon=True)
        if self.process.stderr is not None:
            forwarder.start()
        timeout_s = self.start_timeout_s
        deadline = time.monotonic() + timeout_s
        # one client for every probe: httpx.get makes a client a call, each loading the CA bundle (~25 ms of
        # CPU; ten probes a second while a worker loads cost the supervisor a second of CPU per start)
        with httpx.Client(timeout=1.0) as probe:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    if forwarder.is_alive():
                        forwarder.join(timeout=5)  # its last words
                    raise RuntimeError(
                        self.last_line or f"the {self.name} exited with status {self.process.returncode}"
                    )
                try:
                    if probe.get(self.health_url).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"the {self.name} did not answer on {self.health_url} within {timeout_s:.0f} s")

    def _forward(self, pipe) -> None:
        """Pass the child's stderr through as it comes (progress bars included), keeping its last line."""
        tail = b""
        while chunk := os.read(pipe.fileno(), 65536):
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            tail = (tail + chunk)[-4096:]
            lines = [line.strip() for line in tail.replace(b"\r", b"\n").split(b"\n") if line.strip()]
            if lines:
                self.last_line = lines[-1].decode(errors="replace")
        pipe.close()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the child if it runs."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, waiting=None) -> None:
        """SIGTERM, then wait up to ``stop_s`` for the child's own drain (``waiting(seconds left)`` is
        called every ``WAIT_STEP_S`` meanwhile), then SIGKILL."""
        if not self.process or self.process.poll() is not None:
            return
        self.process.terminate()
        deadline = time.monotonic() + self.stop_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.process.wait(timeout=min(left, self.WAIT_STEP_S))
                return
            except subprocess.TimeoutExpired:
                if waiting is not None and self.process.poll() is None:
                    waiting(deadline - time.monotonic())
        self.kill()

    def kill(self) -> None:
        """SIGKILL: stop at once."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
