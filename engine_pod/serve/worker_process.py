"""Run ``dllm worker`` as a child process and wait until its probe server says it is alive."""

from __future__ import annotations

import sys

from engine_pod.progress import PROGRESS_ENV
from engine_pod.serve.child_process import ProbedProcess
from engine_pod.serve.redis_server import free_port

PORT_ATTEMPTS = 5  # probe ports picked here, tried in turn when another program took one first
PORT_TAKEN = "Address already in use"  # the worker's last line when its probe port was taken


class WorkerProcess(ProbedProcess):
    name = "worker"
    start_timeout_s = 600.0  # /startupz answers once the model is loaded (an 8B download takes a while)

    def __init__(
        self,
        worker_args: list[str],
        probe_port: int | None = None,
        popen_options: dict | None = None,
        stop_s: float = 70.0,
        model: str = "",
    ) -> None:
        """``probe_port`` None: a free port picked here (another, if a program takes it before the worker
        binds it)."""
        self.starting = f"loading the model in the worker ({model})" if model else "starting the worker"
        self.worker_args, self.port_picked = worker_args, probe_port is None
        env = (
            {PROGRESS_ENV: "1"} if sys.stderr.isatty() else {}
        )  # its stderr reaches the terminal through ours
        super().__init__([], "", env, popen_options, stop_s)
        self._probe_on(probe_port or free_port())

    def _probe_on(self, port: int) -> None:
        self.probe_port = port
        self.argv = [sys.executable, "-m", "engine_pod.cli.main", "--quiet", "worker", *self.worker_args]
        self.argv += ["--host", "127.0.0.1", "--port", str(port)]
        self.health_url = f"http://127.0.0.1:{port}/startupz"

    def start(self) -> WorkerProcess:
        """Start it and wait until it is alive; a probe port picked here that another program took between
        the pick and the worker's bind (tests running in parallel) is picked again."""
        for _ in range(PORT_ATTEMPTS if self.port_picked else 1):
            try:
                super().start()
                return self
            except RuntimeError as exc:
                if not (self.port_picked and PORT_TAKEN in str(exc)):
                    raise
                self._probe_on(free_port())
        raise RuntimeError(f"no free port for the worker's probes after {PORT_ATTEMPTS} tries")
