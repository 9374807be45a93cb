"""A serving stack of real processes (redis-server with AOF, ``python -m gateway``, ``dllm worker`` x N)
and a bounded load that counts what a fault did: sent, completed, lost, duplicated, 5xx."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.keys import ServiceKeys
from dllm_contracts.queue.messages import EVENT_FIELD, decode_event
from engine_pod.decoding.config import DecodingConfig
from engine_pod.generation import generate_one
from engine_pod.loading.loader import load_model
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import RedisServer, free_port
from tests.redis_cluster import LocalRedisCluster
from tests.serving_utils import BLOCK, start_worker_process, wait_for

WORKER_FLAGS = ("--dtype", "float64", "--lease-ms", "1500")  # float64: results comparable exactly


@dataclass
class Outcome:
    prompt: str
    stream: bool
    status: int | None = None  # HTTP status; None: no response (connection refused or cut)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None  # error object's message (body or stream event), or the client's exception
    done_marker: bool = False  # a stream's final "data: [DONE]"

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.finish_reason is not None and self.error is None


@dataclass
class Tally:
    outcomes: list[Outcome]
    duplicate_results: int  # done events beyond the first for one request (completion must be once)
    counts: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for o in self.outcomes:
            self.counts["sent"] += 1
            self.counts["completed"] += o.completed
            self.counts["5xx"] += o.status is not None and o.status >= 500
            self.counts["stream_errors"] += o.status == 200 and o.error is not None
            self.counts["lost"] += not o.completed
        self.counts["duplicated"] = self.duplicate_results

    def row(self) -> dict[str, int]:
        return {k: self.counts[k] for k in ("sent", "completed", "lost", "duplicated", "5xx")}


class Stack:
    """Redis (append-only, its own data directory), one gateway process and N worker processes."""

    def __init__(
        self,
        model_dir: Path,
        service: str,
        tmp: Path,
        workers: int = 2,
        redis_backend: RedisServer | LocalRedisCluster | None = None,
        **gateway_env: str,
    ):
        self.model_dir, self.service, self.tmp = model_dir, service, tmp
        (tmp / "redis").mkdir(exist_ok=True)
        self.redis = redis_backend or RedisServer(data_dir=str(tmp / "redis"), appendonly=True)
        self.gateway_env = {
            "DLLM_SERVICE": service,
            "DLLM_MODEL_DIR": str(model_dir),
            "DLLM_MODEL_NAME": "tiny",
            "DLLM_BLOCK_LENGTH": str(BLOCK),
            "DLLM_STEPS_PER_BLOCK": str(BLOCK),
            "DLLM_MAX_TOKENS": "256",
            "DLLM_REQUEST_TIMEOUT_S": "120",
            "DLLM_DRAIN_TIMEOUT_S": "6",
        } | gateway_env
        self.gateway: GatewayProcess | None = None
        self.workers: list[subprocess.Popen] = []
        self.worker_count = workers
        self.worker_flags: tuple[str, ...] = WORKER_FLAGS

    def __enter__(self) -> Stack:
        self.redis.start()
        env = self.gateway_env | {"DLLM_REDIS_URL": self.redis.url}
        self.gateway = GatewayProcess("127.0.0.1", free_port(), env).start()
        self.workers = [self.start_worker(i) for i in range(self.worker_count)]
        return self

    def start_worker(self, index: int) -> subprocess.Popen:
        log = self.tmp / f"worker{index}-{time.monotonic_ns()}.log"
        return start_worker_process(self.model_dir, self.redis.url, self.service, *self.worker_flags, log=log)

    def restart_redis(self) -> None:
        """SIGKILL redis-server, then start it again on the same port and data (AOF replay)."""
        self.redis.kill()
        self.redis = RedisServer(port=self.redis.port, data_dir=str(self.tmp / "redis"), appendonly=True)
        self.redis.start()

    def freeze_redis(self, seconds: float) -> None:
        self.redis.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            self.redis.process.send_signal(signal.SIGCONT)

    def duplicate_results(self) -> int:
        return results_published_twice(sync_client(self.redis.url), self.service)

    def __exit__(self, *exc) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        if self.gateway is not None:
            self.gateway.stop()
        self.redis.stop()


async def _one(client: httpx.AsyncClient, prompt: str, max_tokens: int, stream: bool, model: str) -> Outcome:
    outcome = Outcome(prompt, stream)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    try:
        if stream:
            await _stream(client, body, outcome)
        else:
            reply = await client.post("/v1/completions", json=body)
            outcome.status = reply.status_code
            data = reply.json()
            if reply.status_code == 200:
                outcome.text = data["choices"][0]["text"]
                outcome.finish_reason = data["choices"][0]["finish_reason"]
            else:
                outcome.error = data["error"]["message"]
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome


async def _stream(client: httpx.AsyncClient, body: dict, outcome: Outcome) -> None:
    async with client.stream("POST", "/v1/completions", json=body) as reply:
        outcome.status = reply.status_code
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                outcome.done_marker = True
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                outcome.error = chunk["error"]["message"]
                continue
            choice = chunk["choices"][0]
            outcome.text += choice["text"]
            outcome.finish_reason = choice["finish_reason"] or outcome.finish_reason


async def _load(
    url: str,
    prompts: list[str],
    max_tokens: int,
    concurrency: int,
    stream_every: int,
    model: str,
    answered: list[Outcome],
):
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=180) as client:

        async def bounded(index: int, prompt: str) -> Outcome:
            async with limit:
                outcome = await _one(client, prompt, max_tokens, index % stream_every == 0, model)
            answered.append(outcome)
            return outcome

        return await asyncio.gather(*(bounded(i, p) for i, p in enumerate(prompts)))


@dataclass
class Load:
    """A load running in a background thread: its outcomes once done (in prompt order), and those answered
    so far."""

    future: concurrent.futures.Future
    answered: list[Outcome]

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float) -> list[Outcome]:
        return self.future.result(timeout=timeout)


def start_load(
    url: str,
    prompts: list[str],
    max_tokens: int,
    concurrency: int = 16,
    stream_every: int = 4,
    model: str = "tiny",
) -> Load:
    """Run the load in a background thread."""
    answered: list[Outcome] = []
    pool = concurrent.futures.ThreadPoolExecutor(1)
    run = _load(url, prompts, max_tokens, concurrency, stream_every, model, answered)
    return Load(pool.submit(asyncio.run, run), answered)


def wait_under_way(load: Load, answered: int = 4) -> None:
    """Until ``answered`` requests of the load are answered (the engine is serving it, however fast the
    host), and the rest still running: where a fault must land."""
    wait_for(lambda: len(load.answered) >= answered or load.done(), 120, what="the load to get going")
    assert not load.done(), "the fault must land while the load runs"


def reference_texts(model_dir, prompts: list[str], max_tokens: int) -> list[str]:
    """Each prompt's greedy text, generated alone in float64 (what a float64 worker must return)."""
    from gateway.tokenizer import GatewayTokenizer

    loaded = load_model(str(model_dir), dtype="float64")
    tokenizer = GatewayTokenizer(str(model_dir))
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK)
    texts: dict[str, str] = {}
    for prompt in dict.fromkeys(prompts):
        result = generate_one(loaded, tokenizer.encode(prompt), max_tokens, decoding)
        texts[prompt] = tokenizer.decode(result.token_ids)
    return [texts[p] for p in prompts]


def results_published_twice(client: redis.Redis, service: str) -> int:
    """Results published more than once: done events beyond the first in each request's events stream
    (the gateway keeps delivered events a minute, and completion is fenced to happen once)."""
    extra = 0
    for key in client.scan_iter(ServiceKeys(service).events("*")):
        dones = sum(decode_event(f[EVENT_FIELD.encode()]).type == "done" for _, f in client.xrange(key))
        extra += max(0, dones - 1)
    return extra


def assert_nothing_lost(tally: Tally, duplicated: int, sent: int) -> None:
    """Every request sent completed, none twice, none with a 5xx (the first failures named)."""
    failed = [(o.prompt, o.status, o.error) for o in tally.outcomes if not o.completed][:3]
    assert tally.row() | {"duplicated": duplicated} == {
        "sent": sent,
        "completed": sent,
        "lost": 0,
        "duplicated": 0,
        "5xx": 0,
    }, failed
