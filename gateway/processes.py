"""Several gateway processes on one port: each binds it with SO_REUSEPORT and the kernel spreads new
connections over them, so one pod's gateway uses as many cores as it has processes.

The parent (``python -m gateway`` with ``DLLM_GATEWAY_PROCESSES`` > 1) starts the children, passes them
SIGTERM, SIGINT and SIGHUP (drain; re-read the keys file), and when one exits on its own stops the others
and exits with its status, so that the pod restarts whole. The children share nothing but Redis: each
reads its own requests' events (gateway/event_reader.py), as separate gateway pods do.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1  # prctl(2)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
CHILD_FLAG = "--process-index"  # marks a child and its number (0 serves the metrics port, if any)
SUPERVISED_FLAG = "--supervised"  # under dllm serve: the keys line and the warning are its own
logger = logging.getLogger(__name__)


def shared_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that other processes may bind too (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def exclusive_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that no other socket may share (no SO_REUSEPORT): one gateway
    process alone on its port. Raises OSError (EADDRINUSE) when anything holds the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def port_is_free(host: str, port: int) -> bool:
    """Whether the port can be bound without sharing it (a program already on it keeps it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def run_processes(count: int, argv: list[str]) -> int:
    """Run ``count`` children ``python -m gateway ARGV --process-index i`` until they end."""
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "gateway", *argv, CHILD_FLAG, str(index)], preexec_fn=_child_setup
        )
        for index in range(count)
    ]
    logger.info("gateway: %d processes (pids %s)", count, ", ".join(str(c.pid) for c in children))

    def forward(signum, _frame) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    return _wait(children)


def _child_setup() -> None:
    """In the child before it starts: a process group of its own (a terminal's Ctrl-C reaches the parent
    alone, which passes it on once), and SIGKILL when the parent dies without passing a signal on (killed
    itself): the children go with it at once, as one process would, and free the port."""
    os.setpgrp()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _wait(children: list[subprocess.Popen]) -> int:
    """The first status a child exits with (the others are stopped then), once all have exited."""
    status = None
    while any(child.poll() is None for child in children):
        ended = [child for child in children if child.poll() is not None]
        if ended and status is None:
            status = ended[0].returncode
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
        time.sleep(0.1)
    if status is None:
        status = next((c.returncode for c in children if c.returncode), 0)
    return 0 if status in (0, -signal.SIGTERM, -signal.SIGINT) else (status if status > 0 else 1)
