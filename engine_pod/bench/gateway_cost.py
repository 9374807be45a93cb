"""The serving path's CPU per request, with the engine taken out: what the gateway and redis-server spend.

Starts a private redis-server and the gateway (``python -m gateway``, as deployed) and, in place of a
worker, a peer that speaks the worker's queue protocol and answers every claimed request at once
(one COMMIT per claim round, ``--tokens`` tokens each). Bursts of ``--requests`` completions are sent
at once (``--stream``: streamed); the gateway's and redis-server's CPU time (from /proc) per request is
the figure, not wall time, so it holds on a noisy machine. On a machine whose cores torch shares with
the gateway, each millisecond here is taken from the forwards.

    PYTHONPATH=. python scripts/gateway_cost.py [--requests 128] [--bursts 5] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

import redis

from engine_pod.bench.http_client import LoadClient
from engine_pod.queue.connect import sync_client
from engine_pod.queue.messages import BlockEvent, DoneEvent
from engine_pod.queue.ops import BlockCommit, QueueOps
from engine_pod.queue.sync_client import SyncQueue
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import RedisServer, free_port
from gateway.settings import GatewaySettings

MODEL = Path(__file__).resolve().parent.parent / "assets" / "tiny-llada"
SERVICE = "cost"
BLOCK = 32
logger = logging.getLogger("gateway_cost")


class InstantPeer(threading.Thread):
    """Claims whatever is pending and answers it in the same round: its blocks (streaming requests get
    one event per block) and its result, in one COMMIT."""

    def __init__(self, url: str, tokens: int, service: str = SERVICE) -> None:
        super().__init__(daemon=True)
        self.queue = SyncQueue(sync_client(url), QueueOps(service))
        self.tokens = tokens
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            read = self.queue.candidates(1_000_000, 256)
            claimed = self.queue.claim_chosen("peer", [(c.id, c.prefix) for c in read.shortest])
            if not claimed:
                time.sleep(0.002)
                continue
            blocks, results = [], []
            for item in claimed:
                request, tokens = item.request, [7] * self.tokens
                prompt = len(request.prompt_ids)
                for index in range(self.tokens // BLOCK):
                    end = (index + 1) * BLOCK
                    event = BlockEvent(index, tokens[end - BLOCK : end]) if request.stream else None
                    blocks.append(BlockCommit(request.id, event, tokens[:end], prompt + end, index))
                results.append((request.id, DoneEvent(tokens, "length", prompt, len(tokens), "peer")))
            self.queue.commit("peer", blocks, results, [])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def burst(url: str, count: int, tokens: int, stream: bool) -> None:
    client = LoadClient(url)
    body = {"model": "cost", "prompt": list(range(10, 42)), "max_tokens": tokens}

    async def one() -> None:
        if stream:
            async for _ in client.post_events("/v1/completions", body | {"stream": True}):
                pass
        else:
            await client.post_json("/v1/completions", body)

    await asyncio.gather(*(one() for _ in range(count)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=128, help="requests per burst (all at once)")
    parser.add_argument("--bursts", type=int, default=5, help="bursts measured (after one untimed)")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens (a multiple of 32)")
    parser.add_argument(
        "--access-log", action="store_true", help="with the access log (off, as in dllm bench)"
    )
    parser.add_argument("--stream", action="store_true", help="streamed requests (one event per block)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with RedisServer() as server:
        settings = GatewaySettings(
            redis_url=server.url,
            service=SERVICE,
            model_dir=str(MODEL),
            model_name="cost",
            max_queued=args.requests + 1,
            max_tokens_limit=args.tokens,
            access_log=args.access_log,
        )
        env = settings.to_env() | {"DLLM_LOG_LEVEL": "warning"}
        gateway = GatewayProcess(
            "127.0.0.1", free_port(), env, {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        ).start()
        peer = InstantPeer(server.url, args.tokens)
        peer.start()
        try:
            stats = redis.Redis.from_url(server.url)
            connections = stats.info("stats")["total_connections_received"]
            began = time.perf_counter()
            asyncio.run(burst(gateway.url, args.requests, args.tokens, args.stream))  # a fresh gateway's
            first = (
                time.perf_counter() - began,
                stats.info("stats")["total_connections_received"] - connections,
            )
            rows = []
            for _ in range(args.bursts):
                gateway_cpu, redis_cpu = cpu_seconds(gateway.process.pid), cpu_seconds(server.process.pid)
                connections = stats.info("stats")["total_connections_received"]
                began = time.perf_counter()
                asyncio.run(burst(gateway.url, args.requests, args.tokens, args.stream))
                wall = time.perf_counter() - began
                time.sleep(0.2)  # the gateway's last replies and expiries
                rows.append(
                    (
                        1000 * (cpu_seconds(gateway.process.pid) - gateway_cpu) / args.requests,
                        1000 * (cpu_seconds(server.process.pid) - redis_cpu) / args.requests,
                        wall,
                        stats.info("stats")["total_connections_received"] - connections,
                    )
                )
        finally:
            peer.halt.set()
            gateway.stop()
    logger.info("first burst (a fresh gateway): %.3f s, %d new Redis connections", *first)
    columns = ("gateway CPU ms/request", "redis CPU ms/request", "burst wall s", "new Redis connections")
    for column, name in enumerate(columns):
        values = [row[column] for row in rows]
        logger.info(
            "%-24s median %.3f  (%s)", name, statistics.median(values), " ".join(f"{v:.3f}" for v in values)
        )


if __name__ == "__main__":
    main()
