"""Redis data that takes a while to load, for the tests of what runs while Redis reads its append-only file
back: an append-only file of a given size, and a redis-server made to load slowly."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import redis

from engine_pod.serve.redis_server import RedisServer, find_redis_server


def fill_append_only_file(directory: Path, keys: int, value_bytes: int = 1000) -> None:
    """An append-only file in ``directory`` holding ``keys`` keys (``earlier:0``, ``earlier:1``, ...) of
    ``value_bytes`` each, written by a real redis-server (the one ``dllm serve`` runs)."""
    value = b"v" * value_bytes
    with RedisServer(data_dir=str(directory), appendonly=True) as server:
        client = redis.Redis(port=server.port)
        for start in range(0, keys, 1000):
            pipe = client.pipeline(transaction=False)
            for key in range(start, min(start + 1000, keys)):
                pipe.set(f"earlier:{key}", value)
            pipe.execute()
        client.close()


def slow_loading_args(delay_us: int) -> list[str]:
    """redis-server options that make it load its data slowly: each entry waits ``delay_us``
    (``key-load-delay``), and Redis 7 serves clients every KB it loads (as Redis 6 does every 1000
    entries), so that whatever the machine, a client meets Redis while it loads."""
    version = subprocess.run([find_redis_server(), "--version"], capture_output=True, text=True, check=True)
    args = ["--key-load-delay", str(delay_us)]
    if int(re.search(r"v=(\d+)", version.stdout).group(1)) >= 7:
        args += ["--loading-process-events-interval-bytes", "1024"]
    return args


def slow_loading_redis(directory: Path, delay_us: int) -> dict[str, str]:
    """$DLLM_REDIS_SERVER naming a redis-server (a script in ``directory``) with ``slow_loading_args``."""
    wrapper = directory / "redis-server"
    wrapper.write_text(
        f'#!/bin/sh\nexec "{find_redis_server()}" "$@" {" ".join(slow_loading_args(delay_us))}\n'
    )
    wrapper.chmod(0o755)
    return {"DLLM_REDIS_SERVER": str(wrapper)}
