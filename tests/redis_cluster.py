"""A real Redis Cluster of three masters on loopback ports, for tests (no persistence): without replicas by
default; with ``replicas=1`` each master has a replica that takes over its slots when it dies (Redis
Cluster's own failover), and with ``password`` every node requires it (``masterauth`` too)."""

from __future__ import annotations

import random
import socket
import time

import redis

from engine_pod.serve.redis_server import RedisServer

SLOTS = 16384
BUS_OFFSET = 10000  # a cluster node also listens on its port + 10000 (the cluster bus)
_NODE_ARGS = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start_on_free_ports(node: RedisServer, attempts: int = 5) -> None:
    """Start a node; where its port or bus port was taken between the pick and redis-server's bind (tests
    run in parallel: the server exits at once), on another free pair."""
    for attempt in range(attempts):
        try:
            node.start()
            return
        except RuntimeError:
            if attempt == attempts - 1 or node.process is None or node.process.poll() is None:
                raise
            node.port = _port_with_free_bus()


def _port_with_free_bus(attempts: int = 200) -> int:
    """A free port whose bus port is free too (an ephemeral port + 10000 can pass 65535)."""
    for _ in range(attempts):
        port = random.randint(20000, 30000)
        if _bindable(port) and _bindable(port + BUS_OFFSET):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class LocalRedisCluster:
    """``start()`` runs ``masters`` cluster-enabled redis-servers, splits the slots among them and joins
    them (what ``redis-cli --cluster create --cluster-replicas 0`` does), then gives each master
    ``replicas`` replicas; ``stop()`` ends them all. ``node_timeout_ms``: how long a node may be unreachable
    before the cluster counts it failed (and a replica takes over)."""

    def __init__(
        self,
        masters: int = 3,
        executable: str | None = None,
        replicas: int = 0,
        password: str | None = None,
        node_timeout_ms: int = 5000,
    ) -> None:
        self.password = password
        args = [*_NODE_ARGS, "--cluster-node-timeout", str(node_timeout_ms)]
        if password:
            args += ["--requirepass", password, "--masterauth", password]
        count = masters * (1 + replicas)
        self.all_nodes = [
            RedisServer(port=_port_with_free_bus(), executable=executable, extra_args=args)
            for _ in range(count)
        ]
        self.nodes = self.all_nodes[:masters]  # the masters, as started
        self.replica_nodes = self.all_nodes[masters:]

    @property
    def url(self) -> str:
        """What users pass: the cluster scheme naming one node (the client discovers the others). A live
        one, as a Kubernetes Service in front of every node would: a new client cannot start from a dead
        node."""
        live = [n for n in self.all_nodes if n.process is not None and n.process.poll() is None]
        return f"redis+cluster://127.0.0.1:{(live or self.nodes)[0].port}/0"

    def client(self, node: RedisServer) -> redis.Redis:
        return redis.Redis(port=node.port, password=self.password)

    def start(self, timeout_s: float = 20.0) -> LocalRedisCluster:
        try:
            for node in self.all_nodes:
                _start_on_free_ports(node)
            clients = [self.client(node) for node in self.all_nodes]
            for index, client in enumerate(clients[: len(self.nodes)]):
                first, last = self._slot_range(index)
                client.execute_command("CLUSTER", "ADDSLOTS", *range(first, last))
            for node in self.all_nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            self._wait_until_formed(clients, timeout_s)
            self._attach_replicas(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _attach_replicas(self, timeout_s: float) -> None:
        for index, replica in enumerate(self.replica_nodes):
            master = self.client(self.nodes[index % len(self.nodes)]).execute_command("CLUSTER", "MYID")
            self.client(replica).execute_command("CLUSTER", "REPLICATE", master)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            links = [self.client(r).info("replication").get("master_link_status") for r in self.replica_nodes]
            if all(link == "up" for link in links):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the replicas did not sync within {timeout_s} s")

    def master_of(self, key: str) -> RedisServer:
        """The live node serving ``key``'s slot now (any other node answers MOVED)."""
        for node in self.all_nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            try:
                self.client(node).exists(key)
            except redis.ResponseError:  # MOVED: not this node's slot
                continue
            return node
        raise RuntimeError(f"no live node serves the slot of {key}")

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
        for node in self.all_nodes:
            node.stop()

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
