"""A redis-server started on a port that another program took between the pick and the bind (tests on
parallel workers pick ports at once) moves to another port instead of talking to that program."""

from __future__ import annotations

import socket
import threading

import pytest
import redis

from engine_pod.serve import redis_server
from engine_pod.serve.redis_server import RedisServer


def _picks(monkeypatch, first: int) -> None:
    """free_port() answers ``first`` once, then real free ports."""
    real, given = redis_server.free_port, iter([first])
    monkeypatch.setattr(redis_server, "free_port", lambda: next(given, None) or real())


def test_a_port_taken_by_an_http_server_is_left_for_another(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        def answer_http() -> None:
            connection, _ = taken.accept()
            connection.recv(100)
            connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            connection.close()

        threading.Thread(target=answer_http, daemon=True).start()
        _picks(monkeypatch, port)
        server = RedisServer().start()
        try:
            assert server.port != port and server.process.poll() is None
        finally:
            server.stop()


def test_a_port_taken_by_another_redis_server_is_left_for_another(monkeypatch):
    other = RedisServer().start()
    try:
        _picks(monkeypatch, other.port)
        server = RedisServer().start()
        try:
            assert server.port != other.port
            assert int(redis.Redis(port=server.port).info("server")["process_id"]) == server.process.pid
        finally:
            server.stop()
    finally:
        other.stop()


def test_a_port_given_explicitly_that_is_taken_is_an_error():
    other = RedisServer().start()
    try:
        with pytest.raises(RuntimeError, match=f"port {other.port} is in use"):
            RedisServer(port=other.port).start()
    finally:
        other.stop()
