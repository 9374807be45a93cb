"""Real components for serving tests: redis-server processes, the gateway over HTTP, engine workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import free_port
from gateway.__main__ import gateway_server
from gateway.app import build_app
from gateway.settings import GatewaySettings
from tests.factories import dream_config, llada2_config, llada_config, write_checkpoint

BLOCK = 8

# How long a test waits for a condition before it fails: long enough for a machine three times slower
# than the one the suite was written on, with other work on its cores (a wait that is met returns at once,
# so a generous bound costs nothing when the code is right).
WAIT_S = 120.0


_SERVED_SHAPES = {
    "llada": lambda mask, eos: llada_config(
        d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, mlp=64, vocab=320, mask=mask, eos=eos
    ),
    # two layers, grouped-query attention
    "dream": lambda mask, eos: dream_config(
        hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=320, mask=mask, eos=eos
    ),
    # block diffusion: a dense layer, then a mixture of experts
    "llada2": lambda mask, eos: llada2_config(vocab=320, mask=mask, eos=eos),
}


def write_served_model(directory: Path, seed: int = 0, family: str = "llada") -> Path:
    """A small random LLaDA (Dream, LLaDA2.0) checkpoint with the project's tokenizer and chat template."""
    from engine_pod.training.tokenizer_build import build_tokenizer, save_tokenizer

    tokenizer = build_tokenizer(320)
    raw = _SERVED_SHAPES[family](tokenizer.mask_token_id, tokenizer.eos_token_id)
    write_checkpoint(directory, raw, seed=seed)
    save_tokenizer(tokenizer, directory)
    return directory


class GatewayServer:
    """The real gateway served on 127.0.0.1 in a background thread, as ``python -m gateway`` serves it
    (its uvicorn server and settings; a thread gets no signals: ``terminate`` calls the
    handler a SIGTERM would)."""

    def __init__(self, settings: GatewaySettings, tracing=None) -> None:
        """``tracing``: where the gateway's spans go (None: as OpenTelemetry's variables say)."""
        self.port = free_port()
        app = build_app(settings, tracing=tracing)
        self.server = gateway_server(app, settings, "127.0.0.1", self.port, "warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + WAIT_S
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.02)
        return self

    def terminate(self) -> None:
        """What SIGTERM does to ``python -m gateway``: open requests are told to end, the server stops."""
        self.server.handle_exit(signal.SIGTERM, None)

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


_FILE_STORES = tempfile.TemporaryDirectory(prefix="dllm-files-")  # each gateway's store; gone at exit


def gateway_settings(model_dir: Path, redis_url: str, service: str, **overrides) -> GatewaySettings:
    values = dict(
        redis_url=redis_url,
        service=service,
        model_dir=str(model_dir),
        model_name="tiny",
        block_length=BLOCK,
        steps_per_block=BLOCK,
        default_max_tokens=16,
        max_tokens_limit=64,
        file_store=tempfile.mkdtemp(dir=_FILE_STORES.name),
    )
    return GatewaySettings(**(values | overrides))


def worker_command(model_dir: Path, redis_url: str, service: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "engine_pod.cli.main",
        "worker",
        "--model",
        str(model_dir),
        "--redis",
        redis_url,
        "--service",
        service,
        "--block-length",
        str(BLOCK),
        "--steps-per-block",
        str(BLOCK),
        "--token-budget",
        "2048",
        "--port",
        "0",
        *extra,
    ]


def start_worker_process(
    model_dir: Path,
    redis_url: str,
    service: str,
    *extra: str,
    log: Path | None = None,
    env: dict[str, str] | None = None,
):
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        worker_command(model_dir, redis_url, service, *extra),
        stdout=out,
        stderr=out,
        env=os.environ | {"OMP_NUM_THREADS": "1"} | (env or {}),
    )


PROGRESS_EVERY_S = 1.0  # how often wait_for reads progress (cpu_seconds scans /proc: ms of CPU a read)


def wait_for(
    predicate,
    timeout_s: float = WAIT_S,
    interval_s: float = 0.05,
    what: str = "condition",
    seen=None,
    progress=None,
):
    """Poll ``predicate`` until it returns something true (returned). On timeout the AssertionError says
    what was awaited and what was seen last: ``seen()`` if given, else the predicate's last value.

    ``progress``: a function whose value changes while the awaited work goes on (answers counted, CPU
    seconds spent): each change starts ``timeout_s`` again, which then bounds a stall, not the work (a
    machine three times slower takes three times as long and still passes); it is read once a second."""
    deadline = time.monotonic() + timeout_s
    done = progress() if progress is not None else None
    look_at = time.monotonic() + PROGRESS_EVERY_S
    while not (value := predicate()):
        now = time.monotonic()
        if progress is not None and now >= min(look_at, deadline):
            look_at = now + PROGRESS_EVERY_S
            if (current := progress()) != done:
                done, deadline = current, now + timeout_s
        if time.monotonic() >= deadline:
            last = seen() if seen is not None else value
            stalled = f"{timeout_s:.0f} s without progress" if progress is not None else f"{timeout_s:.0f} s"
            raise AssertionError(f"timed out after {stalled} waiting for {what}; last seen: {last!r:.1500}")
        time.sleep(interval_s)
    return value


def cpu_seconds(pid: int) -> float:
    """CPU seconds a process and its descendants have used so far (0.0 once gone): the progress of one that
    is starting or working (``wait_for(progress=...)``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        if fields := _stat_fields(current):
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
        todo += children.get(current, [])
    return total


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, ...), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None


def completion(client: httpx.Client, prompt: str, max_tokens: int = 16, **extra) -> httpx.Response:
    return client.post(
        "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens} | extra
    )


def logging_gateway(env: dict[str, str], sink) -> GatewayProcess:
    """``python -m gateway`` on a free loopback port at log level info, its output (uvicorn's log and
    access log) written to ``sink``; not started."""
    options = {"stdout": sink, "stderr": subprocess.STDOUT}
    return GatewayProcess("127.0.0.1", free_port(), env, popen_options=options, log_level="info")


class RawReplies:
    """HTTP/1.1 answers read off a raw socket, one at a time (Content-Length or chunked bodies)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._fill():
                raise AssertionError(f"the connection closed {size - len(self.buffer)} bytes short")
        taken, self.buffer = self.buffer[:size], self.buffer[size:]
        return taken

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self._fill():
                raise AssertionError(f"the connection closed inside a line: {self.buffer!r}")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def next(self) -> tuple[int, dict[str, str], bytes]:
        status = int(self._line().split()[1])
        headers = {}
        while line := self._line():
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self._line(), 16):
                body += self._take(size)
                self._line()
            self._line()
            return status, headers, body
        return status, headers, self._take(int(headers.get("content-length", 0)))

    def closed(self) -> bool:
        """Whether the server closed the connection (nothing more arrives)."""
        return not self.buffer and not self._fill()
