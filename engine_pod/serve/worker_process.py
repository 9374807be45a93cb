"""Run ``dllm worker`` as a child process and wait until its probe server says it is alive."""

from __future__ import annotations

import sys

from engine_pod.progress import PROGRESS_ENV
from engine_pod.serve.child_process import ProbedProcess


class WorkerProcess(ProbedProcess):
    name = "worker"
    start_timeout_s = 600.0  # /startupz answers once the model is loaded (an 8B download takes a while)

    def __init__(
        self,
        worker_args: list[str],
        probe_port: int,
        popen_options: dict | None = None,
        stop_s: float = 70.0,
        model: str = "",
    ) -> None:
        self.starting = f"loading the model in the worker ({model})" if model else "starting the worker"
        argv = [sys.executable, "-m", "engine_pod.cli.main", "--quiet", "worker", *worker_args]
        argv += ["--host", "127.0.0.1", "--port", str(probe_port)]
        env = (
            {PROGRESS_ENV: "1"} if sys.stderr.isatty() else {}
        )  # its stderr reaches the terminal through ours
        super().__init__(argv, f"http://127.0.0.1:{probe_port}/startupz", env, popen_options, stop_s)
