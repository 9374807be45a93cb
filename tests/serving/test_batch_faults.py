"""Batches through faults, as users run them: ``dllm serve`` and the official client, a batch created and
then its ingestion interrupted at a random point (Ctrl-C and a restart, kill -9 of the gateway child that
the supervisor restarts, kill -9 of the one of two gateway processes that holds the batch). Every batch
must end ``completed`` with each input line in its output file exactly once and counts equal to it.

The fast versions run in CI on a small batch; the 20,000-line trials are ``slow``.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from dllm_contracts.queue.keys import ServiceKeys
from tests.serving.serve_process import Serve, openai_client
from tests.serving_utils import wait_for

KEYS = ServiceKeys("default")
LINE_BODY = {
    "model": "tiny-llada",
    "messages": [{"role": "user", "content": "count to 5 ."}],
    "max_tokens": 4,
}
FAULTS = ("ctrl-c and restart", "kill -9 gateway", "kill -9 the ingesting one of two gateways")


def _input(lines: int) -> bytes:
    rows = (
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": LINE_BODY}
        for i in range(lines)
    )
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def _cursor(queue: redis.Redis, batch_id: str) -> int:
    return int(queue.hget(KEYS.batch(batch_id), "cursor") or 0)


def _owner_pid(server: Serve, batch_id: str) -> int:
    """The gateway process holding the batch's lease (its owner id names its pid)."""
    owner = redis.Redis(port=server.redis_port()).hget(KEYS.batch(batch_id), "owner").decode()
    return int(owner.rsplit("-", 2)[1])


def _inject(server: Serve, fault: str, batch_id: str, tmp: Path, extra: tuple, env: dict) -> Serve:
    """The fault, then the ``dllm serve`` that carries on (the same one, or a new one on its data)."""
    if fault == "ctrl-c and restart":
        assert server.stop() == 0
        again = Serve(tmp / "again", *extra, env=env)
        again.wait_ready()
        return again
    os.kill(_owner_pid(server, batch_id), signal.SIGKILL)
    return server


def run_trial(tmp: Path, fault: str, lines: int, at: float, chunk: int = 200) -> dict:
    """One batch of ``lines`` lines with ``fault`` once ingestion passed ``at`` of its lines (queued
    ``chunk`` at a time); the batch's final record and its output file's custom_ids."""
    env = os.environ | {"DLLM_BATCH_CHUNK": str(chunk)}
    (tmp / "again").mkdir(parents=True, exist_ok=True)
    extra = ("--gateway-processes", "2") if "two gateways" in fault else ()
    extra += ("--data-dir", str(tmp / "data"), "--batch-max-rows", "0")  # lines as fast as the budget takes
    server = Serve(tmp, *extra, env=env)
    try:
        server.wait_ready()
        client = openai_client(server)
        source = client.files.create(file=("in.jsonl", _input(lines)), purpose="batch")
        batch = client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        mark, queue = int(lines * at), redis.Redis(port=server.redis_port())
        reached = wait_for(lambda: (c := _cursor(queue, batch.id)) >= mark and c, 300, 0.005)
        server = _inject(server, fault, batch.id, tmp, extra, env)
        client = openai_client(server)
        began = time.monotonic()
        done = wait_for(
            lambda: (b := _retrieve(client, batch.id)) is not None and b.status == "completed" and b,
            lines / 10 + 120,
            0.5,
            what="the batch to complete",
        )
        output = client.files.content(done.output_file_id).text.splitlines() if done.output_file_id else []
    finally:
        server.stop()
    ids = [json.loads(line)["custom_id"] for line in output]
    took = time.monotonic() - began
    return {"batch": done, "ids": ids, "cursor_at_fault": reached, "after_fault_s": took}


def _retrieve(client, batch_id: str):
    """The batch, or None while the gateway restarts (connection refused, or 503 during a drain)."""
    try:
        return client.batches.retrieve(batch_id)
    except Exception:  # noqa: BLE001 (openai's connection and status errors alike: try again)
        return None


def check(result: dict, lines: int) -> None:
    batch, ids = result["batch"], result["ids"]
    counts = batch.request_counts
    assert batch.status == "completed"
    assert len(ids) == lines and len(set(ids)) == lines  # every line once, no duplicate
    assert set(ids) == {f"c{i}" for i in range(lines)}
    assert (counts.total, counts.completed, counts.failed) == (lines, lines, 0)
    assert batch.error_file_id is None
    assert result["cursor_at_fault"] < lines, "the fault came after ingestion"


@pytest.mark.parametrize("fault", FAULTS)
def test_a_batch_interrupted_during_ingestion_completes_every_line_once(tmp_path, fault):
    lines = 150
    result = run_trial(tmp_path, fault, lines, at=0.3, chunk=3)  # 50 steps: the fault lands mid-way
    check(result, lines)
    print(f"{fault}: fault at cursor {result['cursor_at_fault']}, done {result['after_fault_s']:.1f} s later")


@pytest.mark.slow
@pytest.mark.timeout(12 * 3600)  # 12 trials of 20,000 lines: hours on 2 cores
def test_large_batches_survive_faults_at_random_points(tmp_path):
    """At least 10 trials over the three faults, each at a random point of ingestion. The environment
    can ask for fewer faults, lines or a smaller chunk (so that the fault lands mid-ingestion)."""
    trials = int(os.environ.get("DLLM_BATCH_FAULT_TRIALS", "12"))
    faults = [FAULTS[int(i)] for i in os.environ.get("DLLM_BATCH_FAULTS", "0,1,2").split(",")]
    lines = int(os.environ.get("DLLM_BATCH_FAULT_LINES", "20000"))
    chunk = int(os.environ.get("DLLM_BATCH_FAULT_CHUNK", "200"))
    rng = random.Random(int(os.environ.get("DLLM_BATCH_FAULT_SEED", "42")))
    for trial in range(trials):
        fault, at = faults[trial % len(faults)], rng.uniform(0.05, 0.9)
        result = run_trial(tmp_path / f"t{trial}", fault, lines, at, chunk)
        check(result, lines)
        print(
            f"trial {trial}: {fault} at cursor {result['cursor_at_fault']} ({at:.2f}): completed "
            f"{len(result['ids'])} lines, {len(set(result['ids']))} distinct, "
            f"{result['after_fault_s']:.1f} s after the fault"
        )


def _waiting(server: Serve) -> float:
    """The gateway's ``dllm_gateway_waiting_requests`` gauge (requests whose results it waits for)."""
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    found = re.search(r"^dllm_gateway_waiting_requests (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.mark.slow
def test_a_drain_answers_the_interactive_requests_queued_behind_a_batch(tmp_path):
    """A batch's lines are all queued, the worker is frozen while 16 chat requests arrive, then Ctrl-C:
    once the worker runs again, the interactive requests go before every batch line and are answered 200
    within the gateway's drain, none 503. (Slow: a 2,000-line batch. One early run answered all 16 with
    503 and was not reproduced since: 11 runs in a row passed, 8 of them beside three busy processes on
    two cores.)"""
    server = Serve(tmp_path)
    try:
        server.wait_ready()
        client = openai_client(server)
        source = client.files.create(file=("in.jsonl", _input(2000)), purpose="batch")
        batch = client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        queue = redis.Redis(port=server.redis_port())
        wait_for(lambda: _cursor(queue, batch.id) == 2000, what="every line queued")
        worker = server.children()["worker"]
        os.kill(worker, signal.SIGSTOP)
        with ThreadPoolExecutor(16) as pool:
            try:
                asks = [pool.submit(_chat_status, server) for _ in range(16)]
                wait_for(lambda: _waiting(server) >= 16, what="16 chat requests waiting")
                server.process.send_signal(signal.SIGINT)
            finally:
                os.kill(worker, signal.SIGCONT)
            statuses = [ask.result() for ask in asks]
    finally:
        server.stop()
    assert statuses == [200] * 16


def _chat_status(server: Serve) -> int:
    body = {"model": "tiny-llada", "messages": [{"role": "user", "content": "count to 5 ."}], "max_tokens": 8}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).status_code
