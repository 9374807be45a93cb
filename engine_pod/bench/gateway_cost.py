"""The serving path's CPU per request, with the engine taken out: what the gateway and redis-server spend.

Starts a private redis-server and the gateway (``python -m gateway``, as deployed) and, in place of a
worker, a peer that speaks the worker's queue protocol and answers every claimed request at once
(one COMMIT per claim round, ``--tokens`` tokens each). Bursts of ``--requests`` requests are sent at
once (a connection each), for each kind: completions and chat, whole or streamed. The figures: the
gateway's and redis-server's CPU time per request (the kernel's per-thread accounting in /proc, in
nanoseconds), which holds on a noisy machine, and requests per second through the gateway (one process,
or ``--processes N``) at saturation (a burst's requests over its wall time). On a machine whose cores
torch shares with the gateway, each millisecond here is taken from the forwards. ``--gateway-source
DIR`` runs the gateway of another checkout (a ``git worktree`` of an older commit) against the same
peer and client, to compare versions.

    PYTHONPATH=. python scripts/gateway_cost.py [--requests 512] [--bursts 7] [--kinds chat,chat-stream]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import subprocess
import threading
import time
from pathlib import Path

from dllm_contracts.defaults import ASSETS_DIR
from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.messages import BlockEvent, DoneEvent
from dllm_contracts.queue.ops import BlockCommit, QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from engine_pod.bench.http_client import LoadClient
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import RedisServer, free_port
from gateway.settings import GatewaySettings

MODEL = ASSETS_DIR / "tiny-llada"
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
                    event = (
                        BlockEvent(index, tokens[end - BLOCK : end], offset=end - BLOCK)
                        if request.stream
                        else None
                    )
                    blocks.append(BlockCommit(request.id, event, tokens[:end], prompt + end, index))
                results.append((request.id, DoneEvent(tokens, "length", prompt, len(tokens), "peer")))
            self.queue.commit("peer", blocks, results, [])


def cpu_seconds(pid: int) -> float:
    """CPU time of the process's threads and of its children's (several gateway processes: the parent's),
    from the scheduler's own accounting (/proc/PID/task/TID/schedstat: nanoseconds, where /proc/PID/stat
    counts clock ticks of 10 ms)."""
    tasks = Path(f"/proc/{pid}/task")
    own = sum(int((task / "schedstat").read_text().split()[0]) for task in tasks.iterdir()) / 1e9
    children = (tasks / str(pid) / "children").read_text().split()
    return own + sum(cpu_seconds(int(child)) for child in children)


KINDS = ("completions", "chat", "completions-stream", "chat-stream")


async def burst(url: str, count: int, tokens: int, kind: str) -> None:
    """``count`` requests of ``kind`` at once."""
    client = LoadClient(url)
    path = "/v1/chat/completions" if kind.startswith("chat") else "/v1/completions"
    body: dict = {"model": "cost", "max_tokens": tokens}
    if kind.startswith("chat"):
        body["messages"] = [{"role": "user", "content": "count to 9 ."}]
    else:
        body["prompt"] = list(range(10, 42))

    async def one() -> None:
        if kind.endswith("stream"):
            async for _ in client.post_events(path, body | {"stream": True}):
                pass
        else:
            await client.post_json(path, body)

    await asyncio.gather(*(one() for _ in range(count)))


def measure(gateway, redis_pid: int, args, kind: str) -> list[tuple[float, float, float]]:
    """Per burst: the gateway's and redis-server's CPU ms per request, and requests per second."""
    asyncio.run(burst(gateway.url, args.requests, args.tokens, kind))  # untimed
    rows = []
    for _ in range(args.bursts):
        gateway_cpu, redis_cpu = cpu_seconds(gateway.process.pid), cpu_seconds(redis_pid)
        began = time.perf_counter()
        asyncio.run(burst(gateway.url, args.requests, args.tokens, kind))
        wall = time.perf_counter() - began
        time.sleep(0.2)  # the gateway's last replies and expiries
        rows.append(
            (
                1000 * (cpu_seconds(gateway.process.pid) - gateway_cpu) / args.requests,
                1000 * (cpu_seconds(redis_pid) - redis_cpu) / args.requests,
                args.requests / wall,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=512, help="requests per burst (all at once)")
    parser.add_argument("--bursts", type=int, default=7, help="bursts measured per kind (after one untimed)")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens (a multiple of 32)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, from {', '.join(KINDS)}")
    parser.add_argument(
        "--access-log", action="store_true", help="with the access log (off, as in dllm bench)"
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="gateway processes on the port (DLLM_GATEWAY_PROCESSES)"
    )
    parser.add_argument(
        "--gateway-source",
        type=Path,
        help="run the gateway from this source tree (another version's checkout) to compare versions",
    )
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
            processes=args.processes,
        )
        options = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        env = settings.to_env()
        if args.gateway_source:
            options["cwd"] = str(args.gateway_source)
            env["PYTHONPATH"] = str(args.gateway_source.resolve())
        try:
            gateway = GatewayProcess("127.0.0.1", free_port(), env, options).start()
        except RuntimeError as exc:  # one line: the gateway did not start
            raise SystemExit(f"gateway_cost: {exc}") from None
        peer = InstantPeer(server.url, args.tokens)
        peer.start()
        try:
            results = {
                kind: measure(gateway, server.process.pid, args, kind) for kind in args.kinds.split(",")
            }
        finally:
            peer.halt.set()
            gateway.stop()
    logger.info(
        "%-20s %22s %22s %18s", "kind", "gateway CPU ms/request", "redis CPU ms/request", "requests/s"
    )
    for kind, rows in results.items():
        medians = [statistics.median(row[i] for row in rows) for i in range(3)]
        logger.info("%-20s %22.3f %22.3f %18.0f", kind, *medians)


if __name__ == "__main__":
    main()
