"""A real Redis Cluster of three masters on loopback ports, for tests (no replicas, no persistence)."""

from __future__ import annotations

import random
import socket
import time

import redis

from engine_pod.serve.redis_server import RedisServer

SLOTS = 16384
BUS_OFFSET = 10000  # a cluster node also listens on its port + 10000 (the cluster bus)
_NODE_ARGS = [
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "5000",
]


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_with_free_bus(attempts: int = 200) -> int:
    """A free port whose bus port is free too (an ephemeral port + 10000 can pass 65535)."""
    for _ in range(attempts):
        port = random.randint(20000, 30000)
        if _bindable(port) and _bindable(port + BUS_OFFSET):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class LocalRedisCluster:
    """``start()`` runs ``masters`` cluster-enabled redis-servers, splits the slots among them and joins
    them (what ``redis-cli --cluster create --cluster-replicas 0`` does); ``stop()`` ends them all."""

    def __init__(self, masters: int = 3, executable: str | None = None) -> None:
        self.nodes = [
            RedisServer(port=_port_with_free_bus(), executable=executable, extra_args=_NODE_ARGS)
            for _ in range(masters)
        ]

    @property
    def url(self) -> str:
        """What users pass: the cluster scheme naming one node (the client discovers the others)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self, timeout_s: float = 20.0) -> LocalRedisCluster:
        try:
            for node in self.nodes:
                node.start()
            clients = [redis.Redis(port=node.port) for node in self.nodes]
            for index, client in enumerate(clients):
                first, last = self._slot_range(index)
                client.execute_command("CLUSTER", "ADDSLOTS", *range(first, last))
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            self._wait_until_formed(clients, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _slot_range(self, index: int) -> tuple[int, int]:
        share = SLOTS // len(self.nodes)
        return index * share, SLOTS if index == len(self.nodes) - 1 else (index + 1) * share

    def _wait_until_formed(self, clients: list[redis.Redis], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            infos = [client.cluster("INFO") for client in clients]
            if all(
                str(i["cluster_state"]) == "ok" and int(i["cluster_known_nodes"]) == len(clients)
                for i in infos
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the Redis Cluster did not form within {timeout_s} s")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
