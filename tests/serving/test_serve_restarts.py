"""``dllm serve`` started over its own data, and stopped with work in its queue, as users run it.

A Redis with an append-only file reads it back when it starts and answers LOADING meanwhile: ``dllm serve``
must wait for it before anything reads the queue (it exited with ``BusyLoadingError`` over an 8 MB file, and
over a large accepted batch). Stopping says what waits in requests, not queue entries (a request with ``n``
4 is four entries), and what survives a restart: every batch; not an interactive request, whose client's
connection ends with the stop (answered 503 within the drain, or cut off by a stop at once: the next start
drops what such a stop left).
"""

from __future__ import annotations

import json
import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import redis

from dllm_contracts.queue.keys import ServiceKeys, request_of
from engine_pod.serve.queue_census import interactive_entries
from tests.serving.serve_process import Serve, chat_batch_file, openai_client
from tests.serving.slow_redis import fill_append_only_file, slow_loading_redis
from tests.serving_utils import WAIT_S, wait_for

KEYS = ServiceKeys("default")


def test_plain_dllm_serve_starts_over_an_8_mb_append_only_file_in_its_default_data_directory(tmp_path):
    """``dllm serve`` as typed, its data directory the default one (under a temporary $HOME) holding an 8 MB
    append-only file: it waits for Redis to load it, serves, and the data is all there."""
    home = tmp_path / "home"
    data = home / ".cache" / "dllm" / "serve" / "default"
    data.mkdir(parents=True)
    keys = 8000  # of 1 KB: an 8 MB file
    fill_append_only_file(data, keys)
    server = Serve(tmp_path, plain=True, env={"HOME": str(home), "XDG_CACHE_HOME": ""})
    try:
        server.wait_ready()
        assert server.answers()
        assert redis.Redis(port=server.redis_port()).exists(*(f"earlier:{k}" for k in range(keys))) == keys
    finally:
        assert server.stop() == 0, server.log.read_text()[-3000:]
    log = server.log.read_text()
    assert str(data) in log and "Redis has loaded its data" in log, log[-3000:]
    assert "Traceback" not in log


def _batch_all_queued(server: Serve, lines: int) -> str:
    client = openai_client(server)
    source = client.files.create(file=("in.jsonl", chat_batch_file(lines, max_tokens=8)), purpose="batch")
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    queue = redis.Redis(port=server.redis_port())
    wait_for(lambda: queue.llen(KEYS.batch_members(batch.id)) == lines, what="every line queued")
    return batch.id


def _completed(client: openai.OpenAI, batch_id: str):
    """The batch once completed, else None (None too while the gateway is away). One client for every
    poll: a client made a poll loads the CA bundle each time (~25 ms of CPU, 20 polls a second)."""
    try:
        batch = client.batches.retrieve(batch_id)
    except Exception:  # noqa: BLE001 (a connection refused or a 503 while Redis reloads: look again)
        return None
    return batch if batch.status == "completed" else None


def _output_ids(server: Serve, batch) -> list[str]:
    output = openai_client(server).files.content(batch.output_file_id).text.splitlines()
    return [json.loads(line)["custom_id"] for line in output]


def test_a_restart_over_an_accepted_batch_waits_for_redis_to_load_it_and_rides_out_a_reload(tmp_path):
    """A batch accepted, ``dllm serve`` stopped (Ctrl-C) and started again on a Redis that loads its file
    slowly: the start waits for it (saying how far it is), and the batch completes. Then Redis is killed
    under the running batch and reloads as slowly: a transient fault, every line still answered once."""
    lines = 1000  # about 22,000 entries in the append-only file: Redis serves clients between them
    first = Serve(tmp_path)
    try:
        first.wait_ready()
        batch_id = _batch_all_queued(first, lines)
    finally:
        assert first.stop() == 0, first.log.read_text()[-3000:]
    (again_dir := tmp_path / "again").mkdir()
    again = Serve(again_dir, "--data-dir", str(tmp_path / "data"), env=slow_loading_redis(tmp_path, 100))
    try:
        again.wait_ready()
        assert "Redis is loading its data" in again.log.read_text()
        client = openai_client(again)
        wait_for(
            lambda: client.batches.retrieve(batch_id).request_counts.completed > 0,
            what="the batch under way",
        )
        os.kill(again.children()["redis"], signal.SIGKILL)
        wait_for(lambda: "restarted the redis-server" in again.log.read_text(), what="Redis restarted")
        done = wait_for(lambda: _completed(client, batch_id), what="the batch to complete")
        ids = _output_ids(again, done)
    finally:
        assert again.stop() == 0, again.log.read_text()[-3000:]
    log = again.log.read_text()
    assert log.count("Redis has loaded its data") == 2, log[-3000:]  # the start, and the restart
    assert "Traceback" not in log
    assert sorted(ids) == sorted(f"c{i}" for i in range(lines))
    assert (done.request_counts.completed, done.request_counts.failed) == (lines, 0)


@pytest.mark.slow
@pytest.mark.timeout(3 * 3600)
def test_a_restart_over_a_20000_line_batch_serves_it_on(tmp_path):
    """The full case: 20,000 lines accepted, Ctrl-C, started again on the same data: the start waits for
    Redis to load the file, and the batch goes on from where it was (it completes, each line once)."""
    lines = 20_000
    first = Serve(tmp_path, "--batch-max-rows", "0")
    try:
        first.wait_ready()
        batch_id = _batch_all_queued(first, lines)
        before = openai_client(first).batches.retrieve(batch_id).request_counts.completed
    finally:
        assert first.stop() == 0, first.log.read_text()[-3000:]
    (again_dir := tmp_path / "again").mkdir()
    again = Serve(again_dir, "--data-dir", str(tmp_path / "data"), "--batch-max-rows", "0")
    try:
        again.wait_ready()
        client = openai_client(again)
        done = wait_for(
            lambda: _completed(client, batch_id), 3 * 3600 - 600, 2.0, what="the batch to complete"
        )
        ids = _output_ids(again, done)
    finally:
        assert again.stop() == 0, again.log.read_text()[-3000:]
    print(f"{before} lines done before the restart; {lines - before} after")
    assert before < lines
    assert sorted(ids) == sorted(f"c{i}" for i in range(lines))
    assert (done.request_counts.completed, done.request_counts.failed) == (lines, 0)


def _ask(server: Serve, n: int, max_tokens: int = 32) -> httpx.Response:
    body = {
        "model": "tiny-llada",
        "messages": [{"role": "user", "content": "count to 9 ."}],
        "max_tokens": max_tokens,
        "n": n,
        "temperature": 1.0,
    }
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=WAIT_S)


def _entries(server: Serve) -> list[str]:
    return interactive_entries(redis.Redis(port=server.redis_port(), decode_responses=True), KEYS)


def test_a_drain_counts_requests_not_choices_and_a_stop_at_once_drops_the_requests_it_cut_off(tmp_path):
    """20 requests of n=4 waiting (the worker frozen) and a batch: the drain says 20 requests (80 choices)
    and the batch lines apart; a stop at once says what it cut off, and the next start drops those requests
    (nobody is left to read their answers) and serves the batch."""
    server = Serve(tmp_path)
    try:
        server.wait_ready()
        batch_id = _batch_all_queued(server, 30)
        os.kill(server.children()["worker"], signal.SIGSTOP)
        with ThreadPoolExecutor(20) as pool:
            asks = [pool.submit(_ask, server, 4) for _ in range(20)]
            wait_for(lambda: len(_entries(server)) == 80, what="20 requests of 4 choices queued")
            entries = _entries(server)
            server.process.send_signal(signal.SIGINT)
            draining = wait_for(
                lambda: re.search(r"the gateway is draining: (.+) in the queue, ", server.log.read_text()),
                what="a line of the drain's progress",
            )
            server.process.send_signal(signal.SIGINT)
            assert server.process.wait(timeout=WAIT_S) == 130
            for ask in asks:
                with pytest.raises(httpx.TransportError):  # cut off with the gateway: no answer
                    ask.result()
    finally:
        server.stop()
    counted = draining.group(1)
    assert re.fullmatch(r"20 requests \(80 choices\) and \d+ batch lines", counted), draining.group(0)
    assert len({request_of(entry) for entry in entries}) == 20  # the entries of one request share their id
    last = server.log.read_text().strip().splitlines()[-1]
    assert re.search(
        r"stopped at once: \d+ batch lines stay in Redis \(.+\) and are served at the next start", last
    )
    assert "; 20 requests (80 choices) were cut off unanswered (the next start drops them" in last, last

    (again_dir := tmp_path / "again").mkdir()
    again = Serve(again_dir, "--data-dir", str(tmp_path / "data"))
    try:
        again.wait_ready()
        assert "dropped 20 requests (80 choices) left from before the last stop" in again.log.read_text()
        wait_for(lambda: not set(entries) & set(_entries(again)), what="the dropped requests gone")
        client = openai_client(again)
        done = wait_for(lambda: _completed(client, batch_id), what="the batch to complete")
        live = redis.Redis(port=again.redis_port(), decode_responses=True).smembers(KEYS.live)
    finally:
        assert again.stop() == 0
    assert (done.request_counts.completed, done.request_counts.failed) == (30, 0)
    assert not set(entries) & live


def test_requests_not_started_within_the_drain_get_a_503_and_only_the_batch_survives_the_restart(tmp_path):
    """Ctrl-C with requests waiting behind a frozen worker: within the drain ($DLLM_DRAIN_TIMEOUT_S) each
    gets a 503 with Retry-After and is dropped; the batch is served after the restart."""
    server = Serve(tmp_path, env={"DLLM_DRAIN_TIMEOUT_S": "5"})
    try:
        server.wait_ready()
        batch_id = _batch_all_queued(server, 30)
        worker = server.children()["worker"]
        os.kill(worker, signal.SIGSTOP)
        with ThreadPoolExecutor(8) as pool:
            asks = [pool.submit(_ask, server, 1) for _ in range(8)]
            wait_for(lambda: len(_entries(server)) == 8, what="8 requests queued")
            entries = _entries(server)
            server.process.send_signal(signal.SIGINT)
            try:
                replies = [ask.result() for ask in asks]
            finally:
                os.kill(worker, signal.SIGCONT)
        assert server.process.wait(timeout=WAIT_S) == 0
    finally:
        server.stop()
    assert [reply.status_code for reply in replies] == [503] * 8
    assert all(reply.headers.get("retry-after") for reply in replies)

    (again_dir := tmp_path / "again").mkdir()
    again = Serve(again_dir, "--data-dir", str(tmp_path / "data"))
    try:
        again.wait_ready()
        client = openai_client(again)
        done = wait_for(lambda: _completed(client, batch_id), what="the batch to complete")
        live = redis.Redis(port=again.redis_port(), decode_responses=True).smembers(KEYS.live)
    finally:
        assert again.stop() == 0
    assert (done.request_counts.completed, done.request_counts.failed) == (30, 0)
    assert "left from before the last stop" not in again.log.read_text()  # the drain ended them already
    assert not set(entries) & live
