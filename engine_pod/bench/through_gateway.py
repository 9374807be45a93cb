"""The ``gateway`` benchmark policies: the same workload through the whole serving path.

A private redis-server, the gateway (its own process) and one worker (on this process's main thread;
BlockServe, or for ``gateway-static`` and ``gateway-sequential`` a baseline behind the same queue) serve
every request over HTTP at once; tokens come back from the queue's stored results, so the
output comparison with the engine-alone policies is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import redis

from dllm_contracts.queue.keys import ServiceKeys
from engine_pod.bench.http_client import LoadClient
from engine_pod.bench.pinning import Pinning
from engine_pod.bench.policies import PolicySpec
from engine_pod.bench.results import PolicyRun, PreparedRequest, RequestOutcome
from engine_pod.decoding.config import DecodingConfig
from engine_pod.device_memory import peak_bytes
from engine_pod.loading.loader import LoadedModel
from engine_pod.runner.factory import make_runner
from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.preflight import reserve_port
from engine_pod.serve.redis_server import RedisServer
from engine_pod.worker.config import WorkerConfig
from engine_pod.worker.worker import Worker
from gateway.settings import GatewaySettings

SERVICE = "bench"
SERVED_NAME = "bench"  # the model's name at the gateway, and the worker's metrics' model label
T = TypeVar("T")


def _gateway_env(loaded: LoadedModel, redis_url: str, decoding: DecodingConfig, requests) -> dict[str, str]:
    longest_prompt = max(len(r.prompt_ids) for r in requests)
    longest_budget = max(r.max_tokens for r in requests)
    settings = GatewaySettings(
        redis_url=redis_url,
        service=SERVICE,
        model_dir=loaded.source,
        model_name=SERVED_NAME,
        max_queued=len(requests) + 1,
        max_prompt_tokens=longest_prompt,
        max_tokens_limit=longest_budget,
        default_max_tokens=min(128, longest_budget),
        block_length=decoding.block_length,
        steps_per_block=decoding.steps_per_block,
        threshold=decoding.threshold,
        access_log=False,  # as serving benchmarks run (vLLM's --disable-log-requests): a line per request
    )
    return settings.to_env()


async def _submit_all(url: str, requests: list[PreparedRequest]) -> tuple[dict[str, str], dict[str, float]]:
    """Post every request at once; map our ids to the queue's and record each latency."""
    started = time.perf_counter()
    ids, latencies = {}, {}
    client = LoadClient(url)

    async def one(item: PreparedRequest) -> None:
        body = {"model": "bench", "prompt": item.prompt_ids, "max_tokens": item.max_tokens}
        ids[item.request_id] = (await client.post_json("/v1/completions", body))["id"]
        latencies[item.request_id] = time.perf_counter() - started

    await asyncio.gather(*(one(item) for item in requests))
    return ids, latencies


@dataclass
class Stack:
    url: str  # the gateway's
    redis_url: str
    worker: Worker
    pinning: Pinning | None = None  # the client thread then runs on the serving cores
    cores: dict[str, list[int]] | None = None  # pinned: where the worker, gateway and Redis may run

    def serve_while(self, load: Callable[[], T]) -> T:
        """Run ``load`` (the clients) in a thread while the worker serves in this one, until the load is
        done; then the worker drains. The worker keeps the main thread because torch's intra-op threads,
        driven from another thread, ran block cycles 1.1-2.4x slower here (one row 2.4x, 64 rows 1.1-1.6x),
        which the serving path does not cost: ``dllm worker`` runs in its own main thread."""
        outcome: dict[str, object] = {}

        def drive() -> None:
            if self.pinning is not None:
                self.pinning.pin_serving_thread()
                self.cores = (self.cores or {}) | {"client": sorted(os.sched_getaffinity(0))}
            try:
                outcome["value"] = load()
            except BaseException as exc:  # raised again in this thread
                outcome["error"] = exc
            finally:
                self.worker.drain()

        thread = threading.Thread(target=drive, daemon=True)
        thread.start()
        self.worker.run()
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


@contextlib.contextmanager
def serving_stack(
    loaded: LoadedModel,
    decoding: DecodingConfig,
    spec: PolicySpec,
    requests: list[PreparedRequest],
    pinning: Pinning | None = None,
) -> Iterator[Stack]:
    """A private redis-server, the gateway (its own process) and one worker serving with the policy's
    scheduler (sharing the loaded model; ``Stack.serve_while`` runs it), up until the block ends. With
    ``pinning`` Redis and the gateway run on the serving cores."""
    if loaded.tokenizer is None:
        raise ValueError("the gateway policy needs a model with a tokenizer")
    options = pinning.serving_process_options() if pinning else {}
    with RedisServer(popen_options=options) as server:
        config = WorkerConfig(
            server.url,
            SERVICE,
            spec.effective_scheduling,
            policy=spec.served_policy,
            batch_size=spec.static_batch_size,
            served_name=SERVED_NAME,
        )
        worker = Worker(make_runner(loaded, decoding, spec.token_budget), config)
        env = _gateway_env(loaded, server.url, decoding, requests)
        held = reserve_port("127.0.0.1", 0, "the gateway", "--port")  # no other process takes it meanwhile
        try:
            gateway = GatewayProcess("127.0.0.1", held.getsockname()[1], env, options).start()
        except BaseException:
            held.close()
            raise
        try:
            stack = Stack(gateway.url, server.url, worker, pinning)
            if pinning is not None:  # as observed: the kernel's record of where each may run
                stack.cores = {
                    "worker": sorted(os.sched_getaffinity(0)),
                    "gateway": sorted(os.sched_getaffinity(gateway.process.pid)),
                    "redis": sorted(os.sched_getaffinity(server.process.pid)),
                }
            yield stack
        finally:
            gateway.stop()
            held.close()


def run_through_gateway(
    loaded: LoadedModel,
    decoding: DecodingConfig,
    spec: PolicySpec,
    requests: list[PreparedRequest],
    pinning: Pinning | None = None,
) -> PolicyRun:
    with serving_stack(loaded, decoding, spec, requests, pinning) as stack:

        def load() -> tuple[dict[str, str], dict[str, float], float]:
            asyncio.run(_submit_all(stack.url, requests[:1]))  # untimed, as the engine's warm-up cycle
            stack.worker.engine.reset_records()
            started = time.perf_counter()
            ids, latencies = asyncio.run(_submit_all(stack.url, requests))
            return ids, latencies, time.perf_counter() - started

        ids, latencies, wall = stack.serve_while(load)
        client, keys = redis.Redis.from_url(stack.redis_url), ServiceKeys(SERVICE)
        outcomes = {}
        for item in requests:
            done = json.loads(client.hget(keys.request(ids[item.request_id]), "result"))
            outcomes[item.request_id] = RequestOutcome(
                done["token_ids"], done["finish_reason"], latencies[item.request_id]
            )
    records = list(stack.worker.engine.records)
    return PolicyRun(spec.name, wall, peak_bytes(loaded.device), outcomes, records, stack.cores)
