"""Warm prefixes (``--warm-prefix``): a worker computes a system prompt's whole blocks into the block prefix
cache before it claims work and pins them; a chat request that starts with that system message (its ids
built as the gateway builds them) finds them cached on entry and is answered as without warm-up; the
pinned blocks survive eviction pressure; LLaDA and Dream refuse in one line, as does a budget the prefixes
do not fit."""

from __future__ import annotations

import time

import pytest
import redis

from dllm_contracts.model_identity import ModelIdentity
from dllm_contracts.queue.messages import DoneEvent, QueuedRequest
from dllm_contracts.queue.ops import QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.cli.main import build_parser, main
from engine_pod.cli.serve import _worker_args
from engine_pod.cli.warm_prefix import warm_prefix_ids
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.worker.config import WorkerConfig
from engine_pod.worker.worker import Worker
from gateway.tokenizer import GatewayTokenizer
from tests.serving.conftest import WorkerThread
from tests.serving_utils import BLOCK, WAIT_S, wait_for, write_served_model

SYSTEM = "you answer in short lines . " * 6  # several whole blocks of the chat template's rendering


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    return write_served_model(tmp_path_factory.mktemp("tiny-llada2"), family="llada2")


def _chat_ids(model_dir, user: str) -> list[int]:
    """A chat request's prompt ids, as the gateway builds them."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    return GatewayTokenizer(str(model_dir)).encode_chat(messages)


def _warm_ids(model_dir, *flags: str) -> tuple[tuple[int, ...], ...]:
    """What ``dllm worker`` warms for ``flags``."""
    argv = ["worker", "--model", str(model_dir), "--redis", "redis://127.0.0.1:1/0", "--service", "s", *flags]
    return warm_prefix_ids(build_parser().parse_args(argv))


def _answer(url: str, service: str, request_id: str, prompt: list[int], max_tokens: int = 16) -> DoneEvent:
    queue = SyncQueue(redis.Redis.from_url(url), QueueOps(service))
    assert queue.run(
        queue.ops.enqueue(
            QueuedRequest(request_id, prompt, RequestParams(max_tokens=max_tokens), time.time()), 0
        )
    )

    def done():
        return next((e for e in queue.events_of(request_id) if isinstance(e, DoneEvent)), None)

    return wait_for(done, WAIT_S, 0.02)


def _entry_hits(worker) -> dict[str, int]:
    """Filled as the worker runs: each request's tokens found cached when it entered the batch (the cycles'
    ``cached_on_entry``)."""
    hits, step = {}, worker.engine.step

    def recorded():
        result = step()
        hits.update(result.stats.cached_on_entry)
        return result

    worker.engine.step = recorded
    return hits


def test_a_chat_that_starts_with_the_warmed_system_prompt_finds_it_cached_and_answers_the_same(
    redis_server, service, make_worker, llada2
):
    (warm,) = _warm_ids(llada2, "--warm-prefix", f"system:{SYSTEM}")
    prompt = _chat_ids(llada2, "count to 5 .")
    assert prompt[: len(warm)] == list(warm) and len(warm) >= 3 * BLOCK
    whole = len(warm) // BLOCK * BLOCK
    answers, hits = [], []
    for name, prefixes in (("warm", (warm,)), ("cold", ())):
        thread = make_worker(
            redis_server.url, service + name, model_dir=llada2, worker={"warm_prefixes": prefixes}
        )
        stats = thread.worker.engine.runner.prefix_cache_stats
        assert stats.cached_tokens == stats.pinned_tokens == (whole if prefixes else 0)  # before any claim
        pinned = thread.worker.metrics.registry.get_sample_value("dllm_prefix_cache_pinned_tokens")
        assert pinned == (whole if prefixes else 0)  # the worker's /metrics says what it warmed
        hits.append(_entry_hits(thread.worker))
        with thread:
            answers.append(_answer(redis_server.url, service + name, "chat", prompt).token_ids)
    assert hits == [{"chat": whole}, {"chat": 0}]
    assert answers[0] == answers[1]


def test_warmed_blocks_survive_eviction_pressure(redis_server, service, llada2):
    """A pool of the token budget's pages (as ``dllm worker`` sizes it) that other prompts' blocks fill."""
    warm, budget = tuple(range(40, 40 + 4 * BLOCK)), 96
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK)
    config = WorkerConfig(
        redis_server.url, service, SchedulerConfig(budget), lease_ms=3000, warm_prefixes=(warm,)
    )
    thread = WorkerThread(Worker(make_runner(load_model(str(llada2)), decoding, budget), config))
    stats = thread.worker.engine.runner.prefix_cache_stats
    assert thread.worker.scheduler.token_budget == budget - 4 * BLOCK
    hits = _entry_hits(thread.worker)
    with thread:
        for n in range(6):  # other prompts' blocks fill the pool and are evicted
            _answer(redis_server.url, service, f"other-{n}", [100 + n] * (3 * BLOCK), max_tokens=BLOCK)
        assert stats.evicted_tokens > 0
        _answer(redis_server.url, service, "warm", [*warm, 7, 8, 9], max_tokens=BLOCK)
    assert hits["warm"] == 4 * BLOCK
    assert stats.pinned_tokens == 4 * BLOCK


def test_prefixes_that_leave_the_budget_no_room_are_refused_in_one_line(
    redis_server, service, make_worker, llada2
):
    with pytest.raises(ValueError, match="leaves the token budget 64 no room") as refused:
        make_worker(
            redis_server.url,
            service,
            token_budget=64,
            model_dir=llada2,
            worker={"warm_prefixes": ((5,) * 60,)},
        )
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("command", ["worker", "serve"])
def test_llada_and_dream_refuse_warm_prefixes_in_one_line(tmp_path, capsys, family, command):
    model = write_served_model(tmp_path / family, family=family)
    where = ["--redis", "redis://127.0.0.1:1/0", "--service", "s"] if command == "worker" else []
    code = main([command, "--model", str(model), *where, "--port", "0", "--warm-prefix", "system:hi"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err and "bidirectional" in err and "approximate" in err, err


def test_serve_hands_its_warm_prefixes_to_its_worker(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "system.txt").write_text("system:be brief")
    flags = ["--warm-prefix", "system:hi", "--warm-prefix", "plain", "--warm-prefix-file", "system.txt"]
    given = build_parser().parse_args(["serve", "--token-budget", "4096", *flags])
    given.service = "default"
    argv = _worker_args(given, "redis://127.0.0.1:1/0", ModelIdentity("m", "0123456789abcdef"))
    passed = [(flag, value) for flag, value in zip(argv, argv[1:]) if flag.startswith("--warm-prefix")]
    assert passed == [
        ("--warm-prefix", "system:hi"),
        ("--warm-prefix", "plain"),
        ("--warm-prefix-file", str(tmp_path / "system.txt")),
    ]
    worker = build_parser().parse_args(["worker", "--redis", "redis://x", "--service", "s", *argv])
    assert worker.warm_prefix == ["system:hi", "plain"]
