"""What ``dllm serve`` checks before it starts anything: the causes a child would otherwise die of after
the model has loaded, each said in one line."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path


class PreflightError(ValueError):
    """A port or a directory ``dllm serve`` cannot use; the message says which and why."""


def check_port_free(host: str, port: int, what: str, flag: str) -> None:
    """Bind ``host:port`` once (as the server will) and let it go."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PreflightError(
                    f"port {port} is in use: {what} cannot listen on it; choose another with {flag}"
                ) from None
            raise PreflightError(f"{what} cannot listen on {host}:{port}: {exc.strerror}") from None


def reserve_port(host: str, port: int, what: str, flag: str) -> socket.socket:
    """Bind ``host:port`` (0: any free port) and keep it bound, not listening, for the caller's life:
    nothing else takes the port while the model loads, and only a socket that also sets SO_REUSEPORT (the
    gateway that ``dllm serve`` starts on it) can join it. The port is ``sock.getsockname()[1]``.

    A port some other program holds is refused first, by a bind without SO_REUSEPORT: the kernel lets any
    process of the same user join a group of SO_REUSEPORT sockets, so a second ``dllm serve`` or gateway
    would otherwise share the port with the first and split its requests."""
    if port:
        check_port_free(host, port, what, flag)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PreflightError(
                f"port {port} is in use: {what} cannot listen on it; choose another with {flag}"
            ) from None
        raise PreflightError(f"{what} cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def check_data_dir(path: Path) -> Path:
    """Create the data directory if need be; it must be writable (Redis keeps its append-only file there)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PreflightError(f"cannot create the data directory {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PreflightError(f"the data directory {path} is not writable; choose another with --data-dir")
    return path


LOCK_FILE = "serve.lock"  # in the data directory: held by the dllm serve that uses it


def hold_data_dir(path: Path):
    """Lock the data directory for this process's life (the returned open file holds the lock; the
    kernel lets it go when the process ends, however it ends). Another running ``dllm serve`` holding it
    is an error: two Redis servers on one append-only file would corrupt it."""
    lock = open(path / LOCK_FILE, "a+")  # noqa: SIM115 (held open until the process ends)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        lock.close()
        if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise PreflightError(f"cannot lock the data directory {path}: {exc.strerror}") from None
        raise PreflightError(
            f"the data directory {path} is in use by another running dllm serve; stop it, or choose "
            "another with --data-dir or --service"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock
