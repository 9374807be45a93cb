"""A tensor-parallel group over two "nodes" on loopback: two `dllm worker` processes (--nodes 2, node ranks 0
and 1, one --group-address) serve the real queue with the tokens of a one-process worker, and kill -9 of
node 1 while the group is idle ends node 0 in one line within a bounded time (real processes, a real
redis-server, 127.0.0.1 only). An idle leader pulses its followers, so a group idle for longer than the
collective timeout still answers (slow: it waits that long)."""

from __future__ import annotations

import dataclasses
import signal
import time

import pytest
import redis

from dllm_contracts.queue.messages import DoneEvent, QueuedRequest
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.parallel.group import COLLECTIVE_TIMEOUT_S, free_address
from engine_pod.runner.factory import make_runner
from engine_pod.runner.tensor_parallel import PULSE, LeaderRunner
from engine_pod.worker.config import WorkerConfig
from engine_pod.worker.worker import Worker
from tests.serving.conftest import WorkerThread
from tests.serving_utils import BLOCK, WAIT_S, start_worker_process, wait_for

PROMPTS = {f"r{n}": [7 + n, 30 + 3 * n, 12, 5 * n + 1][: 2 + n % 3] * (1 + n % 4) for n in range(8)}
MAX_TOKENS = 3 * BLOCK


def _answers(url: str, service: str, tag: str = "") -> dict[str, list[int]]:
    """Every request of PROMPTS enqueued at once (ids prefixed by ``tag``), then each one's committed
    tokens once all are done."""
    queue = SyncQueue(redis.Redis.from_url(url), QueueOps(service))
    requests = [
        QueuedRequest(tag + i, prompt, RequestParams(max_tokens=MAX_TOKENS), time.time())
        for i, prompt in PROMPTS.items()
    ]
    assert queue.run(queue.ops.enqueue_all(requests))

    def done() -> dict[str, DoneEvent] | None:
        found = {
            i: next((e for e in queue.events_of(tag + i) if isinstance(e, DoneEvent)), None) for i in PROMPTS
        }
        return found if all(found.values()) else None

    results = wait_for(done, WAIT_S, 0.1, what=f"every answer of {service}")
    assert all(result.error is None for result in results.values()), results
    return {request_id: result.token_ids for request_id, result in results.items()}


def _one_process_worker(model_dir, url: str) -> WorkerThread:
    """The reference: one process's worker (in this one), float64, as the group's flags decode."""
    loaded = load_model(str(model_dir), dtype="float64")
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK, ignore_eos=True)
    config = WorkerConfig(url, "one", SchedulerConfig(2048), lease_ms=3000)
    return WorkerThread(Worker(make_runner(loaded, decoding, 2048), config))


@pytest.mark.slow  # CI: the idle pulse below, and two ranks killed under dllm serve (test_tensor_parallel_serving)
@pytest.mark.parametrize("idle_s", [0, COLLECTIVE_TIMEOUT_S + 5])
def test_two_nodes_answer_as_one_process_and_node_0_ends_when_node_1_is_killed(
    idle_s, redis_server, served_model, tmp_path
):
    """``idle_s``: how long the group then stays idle (past the collective timeout: its followers' wait
    for the leader's next message would end them without the leader's pulses) before it answers again."""
    address, flags = free_address(), ("--dtype", "float64", "--ignore-eos", "--threads", "1")
    group = ("--tensor-parallel", "2", "--nodes", "2", "--group-address", address, *flags)
    nodes = [
        start_worker_process(
            served_model,
            redis_server.url,
            "two",
            *group,
            "--node-rank",
            str(node),
            log=tmp_path / f"{node}.log",
        )
        for node in (0, 1)
    ]
    try:
        with _one_process_worker(served_model, redis_server.url):
            one = _answers(redis_server.url, "one")
        two = _answers(redis_server.url, "two")
        assert two == one
        if idle_s:
            time.sleep(idle_s)  # the idleness under test, not a wait for something to happen
            assert _answers(redis_server.url, "two", "again-") == one
        assert all(node.poll() is None for node in nodes)
        nodes[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: nodes[0].poll() is not None, COLLECTIVE_TIMEOUT_S + 30, 0.1, what="node 0 to end")
        ended_s = time.monotonic() - killed
    finally:
        for node in nodes:
            node.kill()
            node.wait()
    log = (tmp_path / "0.log").read_text()
    assert nodes[0].returncode != 0, log[-3000:]
    assert ended_s < COLLECTIVE_TIMEOUT_S, log[-3000:]
    assert "dllm worker: error: the tensor-parallel group failed" in log and "Traceback" not in log, log[
        -3000:
    ]


class _Recorded:
    """A leader's place in a group of two whose broadcasts are only recorded (no other rank)."""

    size, rank, leads, pulse_s = 2, 0, True, 0.05

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def broadcast(self, message=None):
        self.sent.append(message)
        return message


def test_an_idle_leader_pulses_its_followers(redis_server, served_model, service):
    """The worker's loop keeps a group's followers waiting while it has no work (a pulse per ``pulse_s``);
    any other message counts as one."""
    loaded = load_model(str(served_model), dtype="float64")
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK, ignore_eos=True)
    group = _Recorded()
    leader = LeaderRunner(make_runner(loaded, decoding, 2048), dataclasses.replace(loaded, parallel=group))
    config = WorkerConfig(redis_server.url, service, SchedulerConfig(2048), lease_ms=3000)
    with WorkerThread(Worker(leader, config)):
        wait_for(lambda: group.sent.count(PULSE) >= 3, WAIT_S, 0.01, what="an idle leader's pulses")
    assert set(group.sent) == {PULSE}
    leader.forget()  # any message tells the followers the leader is there: no pulse due right after one
    leader.keep_alive()
    assert group.sent[-1] == ("forget",)
