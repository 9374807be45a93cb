"""``dllm serve``'s worker on a probe port it picked: a program that takes that port between the pick and
the worker's bind (tests running in parallel) makes it pick another, where a port the user gave
(``--metrics-port``) taken is a one-line error."""

from __future__ import annotations

import socket

import pytest

from engine_pod.serve import worker_process
from engine_pod.serve.redis_server import free_port
from engine_pod.serve.worker_process import WorkerProcess
from tests.serving_utils import worker_command


@pytest.fixture
def taken_port():
    """A port some other program listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_picked_probe_port_taken_before_the_worker_binds_it_is_picked_again(
    taken_port, redis_server, served_model, service, monkeypatch
):
    picks = iter([taken_port])
    monkeypatch.setattr(worker_process, "free_port", lambda: next(picks, None) or free_port())
    worker = WorkerProcess(worker_command(served_model, redis_server.url, service)[4:])
    assert worker.probe_port == taken_port
    try:
        worker.start()
        assert worker.probe_port != taken_port and worker.process.poll() is None
    finally:
        worker.stop()


def test_a_probe_port_the_user_gave_taken_is_an_error_naming_it(
    taken_port, redis_server, served_model, service
):
    worker = WorkerProcess(worker_command(served_model, redis_server.url, service)[4:], taken_port)
    try:
        with pytest.raises(RuntimeError, match=worker_process.PORT_TAKEN):
            worker.start()
    finally:
        worker.stop()
