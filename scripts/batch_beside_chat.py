"""Chat latency alone and beside a running batch, on one ``dllm serve``: does a batch hold up interactive
traffic?

Starts ``dllm serve`` (the shipped model, a fresh data directory) unless ``--url`` names one, then measures
the latency of ``--requests`` chat requests from ``--clients`` concurrent clients (the official client),
first alone, then again right after a ``--batch-lines``-line batch was created, and waits for the batch to
finish. Prints one JSON object: p50 and p99 of both phases, their ratios, and the batch's end.

    python scripts/batch_beside_chat.py --requests 64 --clients 16 --batch-lines 4000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

logger = logging.getLogger("batch_beside_chat")
FINISHED = ("completed", "failed", "cancelled", "expired")
PROGRESS_EVERY_S = 30.0  # while the batch runs: a line at most this often (and at each change of status)
CHAT = {"messages": [{"role": "user", "content": "count to 5 ."}], "max_tokens": 32}
LINE = {"messages": [{"role": "user", "content": "letters from a to e ."}], "max_tokens": 8}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _latencies(client: openai.AsyncOpenAI, model: str, requests: int, clients: int) -> list[float]:
    """Each request's latency, ``clients`` at a time in a closed loop."""
    left, took = list(range(requests)), []

    async def one_client() -> None:
        while left:
            left.pop()
            began = time.perf_counter()
            await client.chat.completions.create(model=model, **CHAT)
            took.append(time.perf_counter() - began)

    await asyncio.gather(*(one_client() for _ in range(clients)))
    return took


def _summary(latencies: list[float]) -> dict:
    return {"p50_s": round(_percentile(latencies, 0.5), 3), "p99_s": round(_percentile(latencies, 0.99), 3)}


async def _create_batch(client: openai.AsyncOpenAI, model: str, lines: int) -> str:
    rows = (
        {
            "custom_id": f"b{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": LINE | {"model": model},
        }
        for i in range(lines)
    )
    content = "".join(json.dumps(row) + "\n" for row in rows).encode()
    source = await client.files.create(file=("batch.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


async def measure(url: str, requests: int, clients: int, batch_lines: int, batch_timeout_s: float) -> dict:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    await _latencies(client, model, clients, clients)  # warm up
    logger.info("chat alone: %d requests from %d clients", requests, clients)
    alone = await _latencies(client, model, requests, clients)
    first = _summary(alone)
    logger.info("chat alone: p50 %.2f s, p99 %.2f s", first["p50_s"], first["p99_s"])
    batch_id = await _create_batch(client, model, batch_lines)
    began = time.monotonic()
    logger.info("batch of %d lines created; chat beside it: %d requests", batch_lines, requests)
    beside = await _latencies(client, model, requests, clients)
    second = _summary(beside)
    logger.info("chat beside the batch: p50 %.2f s, p99 %.2f s", second["p50_s"], second["p99_s"])
    batch = await _wait_for(client, batch_id, began, batch_timeout_s)
    took = time.monotonic() - began
    return {
        "requests": requests,
        "clients": clients,
        "alone": first,
        "beside_batch": second,
        "p50_ratio": round(second["p50_s"] / first["p50_s"], 2),
        "p99_ratio": round(second["p99_s"] / first["p99_s"], 2),
        "batch": {
            "lines": batch_lines,
            "status": batch.status,
            "completed": batch.request_counts.completed,
            "failed": batch.request_counts.failed,
            "seconds": round(took, 1),
        },
    }


async def _wait_for(client: openai.AsyncOpenAI, batch_id: str, began: float, timeout_s: float):
    """The batch once it has finished (or the timeout passed), polled each second; a progress line at
    each change of status and at most every PROGRESS_EVERY_S seconds while lines complete."""
    said, said_at = None, 0.0
    while True:
        batch = await client.batches.retrieve(batch_id)
        counts = batch.request_counts
        done = counts.completed + counts.failed if counts else 0
        now = time.monotonic()
        if said is None or batch.status != said[0] or (done != said[1] and now - said_at >= PROGRESS_EVERY_S):
            total = counts.total if counts else "?"
            logger.info("batch %s: %d of %s lines done, %.0f s", batch.status, done, total, now - began)
            said, said_at = (batch.status, done), now
        if batch.status in FINISHED or now - began > timeout_s:
            return batch
        await asyncio.sleep(1.0)


@contextlib.contextmanager
def _serve(port: int, extra: list[str]):
    """``dllm serve`` on a fresh data directory, stopped (Ctrl-C) after the block."""
    with tempfile.TemporaryDirectory() as data:
        argv = [sys.executable, "-m", "engine_pod.cli.main", "serve", "--port", str(port), "--data-dir", data]
        process = subprocess.Popen([*argv, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        logger.info("starting dllm serve at %s", url)
        try:
            deadline = time.monotonic() + 300
            while not _ready(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"batch_beside_chat: dllm serve did not start (status {process.poll()})")
                time.sleep(0.5)
            yield url
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=120)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running gateway (default: start dllm serve)")
    parser.add_argument(
        "--port", type=int, default=8123, help="port of the dllm serve started (default: 8123)"
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch-lines", type=int, default=4000)
    parser.add_argument("--batch-timeout", type=float, default=1800, help="seconds to wait for the batch")
    parser.add_argument("--serve-arg", action="append", default=[], help="a flag for dllm serve (repeatable)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    # this script's progress only: the HTTP clients would log a line per request and per poll of the batch
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logger.setLevel(logging.INFO)
    with contextlib.nullcontext(args.url) if args.url else _serve(args.port, args.serve_arg) as url:
        result = asyncio.run(measure(url, args.requests, args.clients, args.batch_lines, args.batch_timeout))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
