"""``dllm serve`` as a subprocess on a free port (``--port 0``: the port it holds, read from its "API at"
line, so no other process can take it between the choice and the bind), for tests that drive what users
run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai

from tests.serving_utils import cpu_seconds, wait_for


class Serve:
    def __init__(
        self, tmp: Path, *extra: str, env: dict | None = None, cwd: Path | None = None, plain: bool = False
    ) -> None:
        """``plain``: no --data-dir (the default, under $XDG_CACHE_HOME or $HOME, which ``env`` then points
        at a temporary directory) and no --drain-timeout, as a user types it."""
        self.port = 0  # known once it is ready
        self.log = tmp / "serve.log"
        argv = [sys.executable, "-m", "engine_pod.cli.main", "serve", "--port", "0"]
        argv += [] if plain else ["--data-dir", str(tmp / "data"), "--drain-timeout", "5"]
        argv += extra
        named = [i for i, arg in enumerate(argv[:-1]) if arg == "--data-dir"]
        self.data_dir = Path(argv[named[-1] + 1]) if named else None  # None: the default one
        self.out = open(self.log, "w")  # noqa: SIM115 (closed in stop)
        env = os.environ | {"OMP_NUM_THREADS": "1"} | (env or {})  # one torch thread: the suite shares cores
        self.process = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT, env=env, cwd=cwd)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        """Until its "API at" line, for as long as it keeps starting (its processes using CPU)."""
        wait_for(
            lambda: "API at" in self.log.read_text() or self.process.poll() is not None,
            60,
            0.1,
            what="dllm serve's API",
            seen=lambda: self.log.read_text()[-1000:],
            progress=lambda: round(cpu_seconds(self.process.pid)),  # a second of CPU more: still starting
        )
        assert self.process.poll() is None, self.log.read_text()[-2000:]
        self.port = int(re.search(r"API at http://[^ ]+:(\d+)/v1", self.log.read_text()).group(1))

    def children(self) -> dict[str, int]:
        """The supervisor's children by role, read from /proc (``ps`` cuts long command lines)."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = int((entry / "stat").read_text().rsplit(") ", 1)[1].split()[1])
                args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError, ValueError):
                continue
            if parent != self.process.pid:
                continue
            name = "redis" if "redis-server" in args else "worker" if " worker " in args else "gateway"
            found[name] = int(entry.name)
        return found

    def redis_port(self) -> int:
        """The private Redis's port, from its command line (``redis-server 127.0.0.1:PORT``)."""
        args = Path(f"/proc/{self.children()['redis']}/cmdline").read_bytes().split(b"\0")[0]
        return int(args.rsplit(b":", 1)[1])

    def answers(self) -> bool:
        try:
            body = {"model": "tiny-llada", "prompt": "count to 5 .", "max_tokens": 32}
            return httpx.post(f"{self.url}/v1/completions", json=body, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.out.close()
        return self.process.returncode


@contextlib.contextmanager
def running(directory: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[Serve]:
    """``dllm serve`` started and answering for the block, stopped after it (``env``: variables added to
    this process's environment)."""
    server = Serve(directory, *extra, env=None if env is None else os.environ | env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def chat_batch_file(lines: int, content: str = "count to 60 .", max_tokens: int = 64) -> bytes:
    """A Batch API input file of ``lines`` chat requests to the shipped model, custom ids c0, c1, ..."""
    body = {
        "model": "tiny-llada",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    rows = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(lines)
    ]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def openai_client(server: Serve, key: str = "unused", asynchronous: bool = False):
    """The official client pointed at ``server`` (no retries: a refusal is the test's to see)."""
    kind = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return kind(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def wait_for_batch(client: openai.OpenAI, batch_id: str, status: str = "completed"):
    """The batch once in ``status`` (retrieved with the official client), waited for while its lines keep
    being answered."""

    def now():
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status == status else None

    def answered():
        counts = client.batches.retrieve(batch_id).request_counts
        return (counts.completed, counts.failed) if counts else None

    return wait_for(now, 120, 0.2, what=f"the batch {status}", progress=answered)
