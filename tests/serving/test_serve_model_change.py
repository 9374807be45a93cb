"""A data directory's queue belongs to the model it was accepted for: ``dllm serve`` restarted with another
model over waiting work refuses in one line naming both models and the work, fails that work with an
error when told to, or serves it with the old model first (``--exit-when-drained``); no request accepted
for one model is ever answered by another."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import redis

from dllm_contracts.queue.keys import ServiceKeys
from tests.serving.serve_process import Serve, chat_batch_file, openai_client, running
from tests.serving_utils import WAIT_S, wait_for

LINES = 40  # enough that work still waits when the worker is frozen (16 rows at a time)
OTHER_MODEL = "builtin:tiny-llada2-random"


def _batch_left_waiting(tmp_path: Path) -> tuple[str, int]:
    """A batch created on the shipped model, all its lines queued, then ``dllm serve`` stopped at once with
    work waiting (the worker frozen, Ctrl-C twice): the batch's id and how many lines were done by then."""
    server = Serve(tmp_path, "--lease-ms", "2000")
    try:
        server.wait_ready()
        client = openai_client(server)
        source = client.files.create(file=("c.jsonl", chat_batch_file(LINES)), purpose="batch")
        batch = client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        queue = redis.Redis(port=server.redis_port())
        wait_for(
            lambda: queue.llen(ServiceKeys("default").batch_members(batch.id)) == LINES, what="lines queued"
        )
        os.kill(server.children()["worker"], signal.SIGSTOP)
        done_before = client.batches.retrieve(batch.id).request_counts.completed
        server.process.send_signal(signal.SIGINT)
        wait_for(lambda: "stopping:" in server.log.read_text(), what="the first Ctrl-C taken")
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=WAIT_S) == 130
    finally:
        server.stop()
    assert done_before < LINES
    return batch.id, done_before


def _serve_once(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "engine_pod.cli.main", "serve", "--port", "0"]
    argv += ["--data-dir", str(tmp_path / "data"), *args]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env=os.environ | {"OMP_NUM_THREADS": "1"}
    )


def test_another_model_over_waiting_work_is_refused_then_fails_that_work_when_told(tmp_path):
    batch_id, done_before = _batch_left_waiting(tmp_path)
    refused = _serve_once(tmp_path, "--model", OTHER_MODEL)
    assert refused.returncode == 2, refused.stderr[-2000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("dllm serve: error: the queue in "), last
    waiting = int(
        re.search(
            r"holds (\d+) requests? and 1 unfinished batch accepted for the model tiny-llada ", last
        ).group(1)
    )
    assert 0 < waiting <= LINES - done_before, last
    assert "not tiny-llada2-random (weights " in last and "--on-model-change fail" in last, last
    assert "--model builtin:tiny-llada --exit-when-drained" in last, last
    assert "loading the model" not in refused.stderr  # refused before the model loads

    (again := tmp_path / "again").mkdir()
    with running(
        again, "--model", OTHER_MODEL, "--data-dir", str(tmp_path / "data"), "--on-model-change", "fail"
    ) as server:
        client = openai_client(server)
        ended = wait_for(
            lambda: (b := client.batches.retrieve(batch_id)).status == "completed" and b,
            what="the batch to end",
        )
        errors = client.files.content(ended.error_file_id).text.splitlines()
        answers = client.chat.completions.create(
            model="tiny-llada2-random", messages=[{"role": "user", "content": "count to 3 ."}], max_tokens=8
        )
        queue = redis.Redis(port=server.redis_port())
        payload = json.loads(queue.hget(ServiceKeys("default").request(answers.id), "payload"))
    counts = ended.request_counts
    assert counts.completed + counts.failed == LINES
    assert counts.completed <= LINES - waiting and counts.failed >= waiting  # none answered by the new model
    messages = [json.loads(line)["error"]["message"] for line in errors]
    assert len(messages) == counts.failed
    assert all(
        "accepted for the model tiny-llada (weights " in m and "now serves tiny-llada2-random" in m
        for m in messages
    )
    assert answers.choices[0].finish_reason in ("stop", "length")  # new work is served
    stamped = payload["model"]
    assert stamped.startswith("tiny-llada2-random@") and stamped != "tiny-llada2-random@"


def test_exit_when_drained_serves_the_old_models_work_then_the_new_model_starts(tmp_path):
    batch_id, _ = _batch_left_waiting(tmp_path)
    drained = _serve_once(tmp_path, "--exit-when-drained", "--lease-ms", "2000")
    assert drained.returncode == 0, drained.stderr[-2000:]
    assert "drained: no accepted work waits for tiny-llada" in drained.stderr
    (again := tmp_path / "again").mkdir()
    with running(again, "--model", OTHER_MODEL, "--data-dir", str(tmp_path / "data")) as server:
        ended = openai_client(server).batches.retrieve(batch_id)
    assert ended.status == "completed"
    assert (ended.request_counts.completed, ended.request_counts.failed) == (LINES, 0)
