"""The engine worker: probes and Prometheus metrics, per-request thresholds, long prompts, draining."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client import generate_latest

from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.model_identity import ModelIdentity
from dllm_contracts.queue.messages import BlockEvent, DoneEvent, QueuedRequest
from dllm_contracts.queue.ops import Candidate, QueueOps
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from dllm_contracts.text import completion_tokens
from engine_pod.cli.main import build_parser, main
from engine_pod.cli.worker import build_worker
from engine_pod.decoding.config import DecodingConfig
from engine_pod.generation import generate_one
from engine_pod.loading.loader import load_model
from engine_pod.scheduler.request import Request
from engine_pod.serve.redis_server import RedisServer, free_port
from engine_pod.worker.config import WorkerConfig
from engine_pod.worker.http import ProbeSource, serve_probes
from engine_pod.worker.worker import RECORD_WINDOW
from tests.engine_utils import tokens
from tests.serving_utils import BLOCK, WAIT_S, wait_for, worker_command

ROOT = Path(__file__).resolve().parents[2]


def _enqueue(
    url: str,
    service: str,
    request_id: str,
    prompt_len: int,
    max_tokens: int = 16,
    threshold=None,
    stream=False,
) -> SyncQueue:
    queue = SyncQueue(redis.Redis.from_url(url), QueueOps(service))
    request = QueuedRequest(
        request_id,
        [7] * prompt_len,
        RequestParams(max_tokens=max_tokens, threshold=threshold),
        time.time(),
        stream=stream,
    )
    assert queue.run(queue.ops.enqueue(request, 0))
    return queue


def _done(queue: SyncQueue, request_id: str) -> DoneEvent | None:
    return next((e for e in queue.events_of(request_id) if isinstance(e, DoneEvent)), None)


def _all_done(queue: SyncQueue, request_ids) -> dict[str, DoneEvent] | None:
    """Every request's result by id, or None while one is missing (for ``wait_for``)."""
    done = {request_id: _done(queue, request_id) for request_id in request_ids}
    return done if all(done.values()) else None


def _kept_about(worker, request_id: str) -> list[str]:
    """The worker's per-request records that still hold ``request_id`` (none, once it is dropped)."""
    maps = {"served": worker._served, "outbox": worker._outbox}
    return [name for name, kept in maps.items() if request_id in kept]


def test_probes_and_metrics(redis_server, service, make_worker):
    worker_thread = make_worker(redis_server.url, service)
    port = free_port()
    probes = ProbeSource()
    server = serve_probes("127.0.0.1", port, probes)
    assert httpx.get(f"http://127.0.0.1:{port}/startupz").status_code == 503  # nothing attached yet
    probes.attach(worker_thread.worker.metrics.registry, worker_thread.worker.ready)
    try:
        started = time.monotonic()
        with worker_thread as worker:
            queue = _enqueue(redis_server.url, service, "r-1", 5)
            wait_for(lambda: _done(queue, "r-1"), what="the request to finish")
            base = f"http://127.0.0.1:{port}"
            assert httpx.get(f"{base}/healthz").status_code == 200
            assert httpx.get(f"{base}/readyz").status_code == 200
            metrics = httpx.get(f"{base}/metrics").text
            generated = [
                line for line in metrics.splitlines() if line.startswith("dllm_generated_tokens_total")
            ]
            assert generated and float(generated[0].split()[-1]) > 0  # moved with the finished request
            cycle_seconds = _sample(metrics, "dllm_block_cycle_seconds_sum")
            assert 0 < cycle_seconds < time.monotonic() - started  # each cycle's own duration, summed
            assert _sample(metrics, "dllm_block_cycle_seconds_count") == len(worker.engine.records)
            for state in ("pending", "inflight"):  # as the last reaping pass saw them: one request
                assert _sample(metrics, f'dllm_queue_depth{{state="{state}"}}') in (0, 1)
            budget = [line for line in metrics.splitlines() if line.startswith("dllm_token_budget")]
            assert budget and float(budget[0].split()[-1]) == worker.config.scheduling.token_budget
            logits = sum(record.logits_materialized for record in worker.engine.records)
            assert _sample(metrics, "dllm_logits_materialized_total") == logits > 0  # positions x vocabulary
            assert 0 < _sample(metrics, "dllm_logits_at_once") <= logits
            dense = sum(record.kv_dense_bytes for record in worker.engine.records)
            assert _sample(metrics, "dllm_kv_dense_bytes_total") == dense > 0
            assert _sample(metrics, "dllm_kv_kept_bytes_total") == dense  # a dense cache keeps it all
            assert _sample(metrics, "dllm_kv_kept_share") == 1
            for name in (
                "dllm_generated_tokens_total",
                "dllm_queue_depth",
                "dllm_active_rows",
                "dllm_box_width",
                "dllm_padding_efficiency",
                "dllm_block_cycle_seconds_bucket",
                "dllm_token_budget",
            ):
                assert name in metrics, name
            worker.drain()
            assert httpx.get(f"{base}/readyz").status_code == 503
    finally:
        server.shutdown()


def test_a_sparse_cache_shows_the_share_it_keeps_on_metrics(redis_server, service, make_worker):
    sparse = HeadSparseConfig(mode="uniform", retention=0.3)
    with make_worker(redis_server.url, service, cache="dual", sparse=sparse) as worker:
        queue = _enqueue(redis_server.url, service, "r-sparse", 16)
        wait_for(lambda: _done(queue, "r-sparse"), what="the request to finish")
        metrics = generate_latest(worker.metrics.registry).decode()
    dense, kept = (_sample(metrics, f"dllm_kv_{kind}_bytes_total") for kind in ("dense", "kept"))
    assert 0 < kept < dense
    assert _sample(metrics, "dllm_kv_kept_share") == pytest.approx(kept / dense)


def _sample(metrics: str, name: str) -> float:
    (value,) = [float(line.split()[-1]) for line in metrics.splitlines() if line.split(" ")[0] == name]
    return value


def test_long_prompts_are_claimed_under_a_small_budget(redis_server, service, make_worker):
    """Claiming many rows caps each width; the worker must still take the long prompts, fewer at a time."""
    with make_worker(redis_server.url, service, token_budget=600):
        queue = _enqueue(redis_server.url, service, "long", 400, max_tokens=16)
        for index in range(10):
            _enqueue(redis_server.url, service, f"short-{index}", 5, max_tokens=16)
        ids = ["long"] + [f"short-{i}" for i in range(10)]
        wait_for(lambda: all(_done(queue, i) for i in ids), 120, what="every request")
    assert _done(queue, "long").finish_reason in ("stop", "length")


def test_no_claimed_request_is_rejected_for_its_size_near_the_budget(redis_server, service, make_worker):
    """Prompts and max_tokens whose peak width lands at or just under the budget, mixed with short ones:
    the worker claims only what its scheduler admits, so none is ever answered with a size error."""
    budget, rng = 400, random.Random(7)
    shapes = {}
    for index in range(12):  # peak = prompt + blocks x BLOCK, from budget - 2 BLOCK to the budget itself
        blocks = rng.randint(1, 6)
        shapes[f"near-{index}"] = (budget - blocks * BLOCK - rng.randint(0, 2 * BLOCK), blocks * BLOCK)
    shapes |= {f"short-{index}": (rng.randint(3, 30), rng.choice([8, 16, 40])) for index in range(20)}
    with make_worker(redis_server.url, service, token_budget=budget) as worker:
        for request_id, (prompt, max_tokens) in rng.sample(sorted(shapes.items()), len(shapes)):
            queue = _enqueue(redis_server.url, service, request_id, prompt, max_tokens=max_tokens)
        results = wait_for(
            lambda: _all_done(queue, shapes),
            180,
            what="every request",
        )
        cycles = list(worker.engine.records)
    assert {i: d.finish_reason for i, d in results.items() if d.finish_reason not in ("stop", "length")} == {}
    assert max(c.cost for c in cycles) <= budget


# How many short requests enqueued after the long prompt the control lets finish before it says the long
# one starves (with the bound, none of them would overtake it once it has waited past the bound).
OVERTAKERS = 60


@pytest.mark.parametrize("max_wait_s", [1.0, 0.0], ids=["bound", "no-bound"])
def test_a_long_prompt_waiting_past_the_bound_is_claimed_while_short_ones_keep_arriving(
    redis_server, service, make_worker, max_wait_s
):
    """Fairness across the queue: the wait counts from enqueueing, so a steady stream of short requests,
    each admitted first by sand filling, cannot keep a long prompt out past the bound: it is served after
    the requests enqueued before it (first come, first served among those past the bound). Without the
    bound (the control) the long prompt, which fits only alone, stays queued while shorter requests that
    came after it keep overtaking it. Measured in requests served, not in time: the host's speed does not
    matter (the 180 s are a hang guard)."""
    budget = 480  # the long prompt's row (300 + 2 blocks) fits only alone
    # few rows, so that a read of the shortest never reaches the long prompt behind the queued short ones:
    # only the aged read can bring it in (with 256 rows a read takes every short one queued, and whether
    # the long one came with them depended on how far the worker had got)
    fairness = {"max_wait_s": max_wait_s, "max_rows": 8}
    with make_worker(
        redis_server.url, service, token_budget=budget, scheduling=fairness, ignore_eos=True
    ) as worker:
        queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
        shorts: list[str] = []

        def top_up() -> None:  # keep far more short work queued than the worker runs meanwhile
            while queue.depth()[0] < 200:  # ids sort as they were enqueued: equal prompts go in order
                batch = [f"short-{len(shorts) + i:06d}" for i in range(50)]
                shorts.extend(batch)
                queue.run(
                    queue.ops.enqueue_all(
                        [QueuedRequest(i, [7] * 20, RequestParams(max_tokens=64), time.time()) for i in batch]
                    )
                )

        def served() -> int:
            sample = worker.metrics.registry.get_sample_value(
                "dllm_requests_completed_total", {"finish_reason": "length"}
            )
            return int(sample or 0)

        top_up()
        wait_for(lambda: _done(queue, shorts[0]), what="the short requests to start")
        _enqueue(redis_server.url, service, "long", 300, max_tokens=16)
        enqueued_before_it = len(shorts)  # the long prompt comes after every short one so far

        def settled() -> bool:
            if max_wait_s:
                return _done(queue, "long") is not None
            return served() >= enqueued_before_it + OVERTAKERS

        hang_guard = time.monotonic() + 180
        while not settled() and time.monotonic() < hang_guard:
            top_up()
            time.sleep(0.02)
        long_done = _done(queue, "long")
        overtakers = served() - (long_done is not None) - enqueued_before_it
        still_queued = queue.depth()[0]
    assert still_queued > 100, "the stream of short requests ran dry: the test proves nothing"
    if max_wait_s:
        assert long_done is not None and long_done.finish_reason == "length"
        assert overtakers < OVERTAKERS, "with the bound, the requests that came later must not overtake"
    else:
        assert overtakers >= OVERTAKERS, "the control ran out of time before shorter requests overtook"
        assert long_done is None, "without the bound, sand filling keeps admitting the shorter requests"


def test_a_claimed_request_keeps_the_wait_it_had_in_the_queue(redis_server, service, make_worker):
    """The scheduler sees a claimed request as enqueued when it was, not when it was claimed: its aging
    (the wait bound, and a preempted row's place) counts from there."""
    queue = _enqueue(redis_server.url, service, "r-waited", 5, max_tokens=64 * 8)
    time.sleep(1.0)  # queued, no worker yet
    with make_worker(redis_server.url, service, ignore_eos=True) as worker:
        _wait_for_block(queue, "r-waited")
        held = worker.scheduler.requests["r-waited"]
        waited = held.first_scheduled_time - held.arrival_time
    assert 1.0 <= waited < 30


def test_a_claim_that_lost_a_candidate_hands_back_the_one_no_longer_admissible(
    redis_server, service, make_worker
):
    """Another worker takes one of two candidates between our read and our claim. The dense box's
    padding rule admitted the wide one only beside the narrower one it lost, so the wide one goes
    straight back to the queue (pending, its prefix as its score, no tokens, no owner) rather than being
    held unadmitted; it is served later, as is the one the other worker gave back."""
    decoding = {"remasking": "low_confidence", "ignore_eos": True}  # every block takes its 8 steps
    scheduling = {"layout": "dense", "max_wait_s": 0.0, "min_padding_efficiency": 0.7}
    with make_worker(
        redis_server.url, service, token_budget=4096, scheduling=scheduling, **decoding
    ) as worker:
        queue = _enqueue(redis_server.url, service, "running", 312, max_tokens=10 * BLOCK)
        _wait_for_block(queue, "running")  # its row: 320-392 tokens wide while it runs
        claim_chosen, stolen = worker.queue.claim_chosen, []

        def another_worker_takes_the_first(worker_id: str, chosen: list[tuple[str, int]]):
            if len(chosen) == 2 and not stolen:  # once: the read that saw both
                stolen.extend(queue.claim_chosen("other", chosen[:1]))
                chosen = chosen[1:]
            return claim_chosen(worker_id, chosen)

        worker.queue.claim_chosen = another_worker_takes_the_first
        narrow = QueuedRequest("narrow", [7] * (800 - BLOCK), RequestParams(max_tokens=BLOCK), time.time())
        wide = QueuedRequest("wide", [7] * (1000 - BLOCK), RequestParams(max_tokens=BLOCK), time.time())
        assert queue.run(queue.ops.enqueue_all([narrow, wide]))
        wait_for(lambda: stolen, what="the claim of both")
        assert [c.request.id for c in stolen] == ["narrow"], "the scenario did not arise"
        handed_back = wait_for(
            lambda: (
                queue.redis.zscore(queue.ops.keys.pending, "wide") is not None
                and "wide" not in worker.scheduler.requests
            ),
            10,
            0.005,
            what="the wide request back in the queue",
        )
        record = queue.redis.hmget(queue.ops.keys.request("wide"), "state", "worker", "generated", "score")
        score = queue.redis.zscore(queue.ops.keys.pending, "wide")
        assert queue.release("other", "narrow", [], len(narrow.prompt_ids))
        results = wait_for(
            lambda: _all_done(queue, ("running", "narrow", "wide")),
            WAIT_S,
            what="every result",
        )
    assert handed_back and score == len(wide.prompt_ids)
    assert record == [b"pending", b"", b"[]", str(len(wide.prompt_ids)).encode()]
    assert [(len(d.token_ids), d.finish_reason, d.worker) for d in results.values()] == [
        (10 * BLOCK, "length", worker.worker_id),
        (BLOCK, "length", worker.worker_id),
        (BLOCK, "length", worker.worker_id),
    ]


def test_each_request_decodes_with_its_own_threshold_as_dllm_generate_does(
    redis_server, service, make_worker, served_model
):
    """A request's threshold, not the worker's: its answer is what ``dllm generate`` gives at that
    threshold, and a strict threshold takes more forwards than a loose one (else the comparison proves
    nothing)."""
    tokens, prompt = 4 * BLOCK, [9, 8, 7, 6, 5]
    loaded = load_model(str(served_model))
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    answers, forwards = {}, {}
    with make_worker(redis_server.url, service, threshold=0.5, ignore_eos=True) as worker:
        for threshold in (0.05, 0.99):  # one at a time: each alone in its cycles
            request_id = f"t-{threshold}"
            assert queue.run(
                queue.ops.enqueue(
                    QueuedRequest(
                        request_id, prompt, RequestParams(max_tokens=tokens, threshold=threshold), 0.0
                    ),
                    0,
                )
            )
            worker.engine.reset_records()
            answers[threshold] = wait_for(
                lambda: _done(queue, request_id),  # noqa: B023
                WAIT_S,
                what="the answer",
            ).token_ids
            forwards[threshold] = sum(r.forwards for r in worker.engine.records)
    for threshold, answer in answers.items():
        config = DecodingConfig(
            block_length=BLOCK, steps_per_block=BLOCK, threshold=threshold, ignore_eos=True
        )
        assert answer == generate_one(loaded, prompt, tokens, config).token_ids
    assert forwards[0.99] > forwards[0.05]


def test_a_worker_on_the_full_canvas_answers_as_dllm_generate_does(
    redis_server, service, make_worker, served_model
):
    """The canvas is the worker's decoding setting, passed to its scheduler too (the full canvas keeps
    every later block masked in view): two requests, one batch, each as ``dllm generate`` gives it."""
    loaded = load_model(str(served_model))
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    prompts = {"full-a": [9, 8, 7, 6, 5], "full-b": [5, 6, 7] * 4}
    requests = [
        QueuedRequest(i, p, RequestParams(max_tokens=3 * BLOCK), time.time()) for i, p in prompts.items()
    ]
    assert queue.run(queue.ops.enqueue_all(requests))
    with make_worker(redis_server.url, service, masked_suffix=True, ignore_eos=True):
        results = wait_for(
            lambda: _all_done(queue, prompts),
            WAIT_S,
            what="the answers",
        )
    config = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK, masked_suffix=True, ignore_eos=True)
    block_canvas = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK, ignore_eos=True)
    for request_id, prompt in prompts.items():
        assert results[request_id].token_ids == generate_one(loaded, prompt, 3 * BLOCK, config).token_ids
    differs = [
        generate_one(loaded, p, 3 * BLOCK, block_canvas).token_ids != results[i].token_ids
        for i, p in prompts.items()
    ]
    assert any(differs), "the block canvas gives the same answers: the test proves nothing"


def test_leases_results_and_records_are_as_configured(redis_server, service, make_worker):
    """The worker's queue takes its lease and result lifetime from its settings (a claimed request's
    deadline in Redis is a lease away; a finished one's record expires after the result TTL), and a
    long-running worker remembers a bounded window of block cycles."""
    lease_ms, ttl_s = 1500, 77
    with make_worker(
        redis_server.url, service, worker={"lease_ms": lease_ms, "result_ttl_s": ttl_s}, ignore_eos=True
    ) as worker:
        queue = _enqueue(redis_server.url, service, "r-leased", 5, max_tokens=64 * 8)
        _wait_for_block(queue, "r-leased")
        deadline_ms = queue.redis.zscore(queue.ops.keys.inflight, "r-leased")
        left_ms = deadline_ms - time.time() * 1000
        queue.run(queue.ops.cancel("r-leased", 5))
        wait_for(lambda: _done(queue, "r-leased"), what="the cancelled result")
        record_ttl = queue.redis.ttl(queue.ops.keys.request("r-leased"))
    assert 0 < left_ms <= lease_ms
    assert 0 < record_ttl <= ttl_s
    assert worker.engine.records.maxlen == RECORD_WINDOW


def test_sampled_requests_draw_with_their_own_seeds(redis_server, service, make_worker):
    """Sampling settings travel with each request: the same seed gives the same answer (two rows of one
    batch), another seed another answer, and greedy (no settings) a third."""
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    sampled = {"temperature": 1.5, "top_p": 1.0, "top_k": 0}
    requests = [
        QueuedRequest(request_id, [7] * 5, RequestParams(max_tokens=4 * BLOCK, **settings), time.time())
        for request_id, settings in [
            ("seed-5", sampled | {"seed": 5}),
            ("seed-5-again", sampled | {"seed": 5}),
            ("seed-6", sampled | {"seed": 6}),
            ("greedy", {}),
        ]
    ]
    assert queue.run(queue.ops.enqueue_all(requests))
    with make_worker(redis_server.url, service, ignore_eos=True):
        results = wait_for(
            lambda: _all_done(queue, [r.id for r in requests]),
            WAIT_S,
            what="the answers",
        )
    answers = {request_id: done.token_ids for request_id, done in results.items()}
    assert answers["seed-5"] == answers["seed-5-again"]
    assert len({tuple(answers[i]) for i in ("seed-5", "seed-6", "greedy")}) == 3


def test_a_request_with_fields_this_engine_does_not_know_ends_with_their_names(
    redis_server, service, make_worker
):
    """A newer gateway's payload (a field added since): the request ends at once with an error naming the
    field, instead of failing every claim that holds it; the worker goes on serving."""
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    newer = QueuedRequest("newer", [7] * 5, RequestParams(max_tokens=BLOCK), time.time())
    newer.speculation = {"draft": "tiny"}  # to_json writes every attribute: a field this version lacks
    fine = QueuedRequest("fine", [7] * 5, RequestParams(max_tokens=BLOCK), time.time())
    assert b'"speculation"' in newer.to_json()
    assert queue.run(queue.ops.enqueue_all([newer, fine]))
    with make_worker(redis_server.url, service):
        refused = wait_for(lambda: _done(queue, "newer"), what="the error")
        assert wait_for(lambda: _done(queue, "fine"), what="the next answer").finish_reason != "error"
    assert (refused.finish_reason, refused.token_ids) == ("error", [])
    assert (
        refused.error == "speculation: unknown to this engine (sent by a newer gateway); upgrade the engine"
    )


def test_a_request_accepted_for_another_model_ends_with_an_error_naming_both(
    redis_server, service, make_worker
):
    """A worker serving one model never answers a request stamped for another (a queue whose model
    changed under it): the request ends with an error naming both; one stamped for this model, and one
    stamped with none (accepted where no identity was set), are answered."""
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    other = QueuedRequest(
        "other", [7] * 5, RequestParams(max_tokens=BLOCK), time.time(), model="tiny-llada@0e19b480c73cad7a"
    )
    same = QueuedRequest(
        "same", [7] * 5, RequestParams(max_tokens=BLOCK), time.time(), model="tiny@00ff00ff00ff00ff"
    )
    unstamped = QueuedRequest("unstamped", [7] * 5, RequestParams(max_tokens=BLOCK), time.time())
    assert queue.run(queue.ops.enqueue_all([other, same, unstamped]))
    identity = ModelIdentity("tiny", "00ff00ff00ff00ff")
    with make_worker(redis_server.url, service, worker={"model_identity": identity}):
        refused = wait_for(lambda: _done(queue, "other"), what="the error")
        answered = [wait_for(lambda i=i: _done(queue, i), what=i) for i in ("same", "unstamped")]
    assert (refused.finish_reason, refused.token_ids) == ("error", [])
    assert refused.error == (
        "this request was accepted for the model tiny-llada (weights 0e19b480c73cad7a), and the service now "
        "serves tiny (weights 00ff00ff00ff00ff): send it again"
    )
    assert [done.finish_reason for done in answered] == ["length", "length"]


def test_invalid_sampling_settings_end_the_request_with_a_clear_error(redis_server, service, make_worker):
    """Settings the gateway would never send (a client of the queue's own): the request ends at once, with
    its error, its meta and no tokens, and the worker goes on serving. A model family's settings (here
    DiffusionGemma's) are refused by a model whose family does not add them, naming them."""
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    bad = QueuedRequest("bad", [7] * 5, RequestParams(max_tokens=BLOCK, temperature=1.0), time.time())
    object.__setattr__(bad.params, "top_p", 7.0)  # what the contract refuses to build: another client's
    bad.meta = {"custom_id": "line-1"}
    canvas = QueuedRequest(
        "canvas",
        [7] * 5,
        RequestParams(max_tokens=BLOCK, family={"t_min": 0.1, "entropy_bound": 1.0}),
        time.time(),
    )
    fine = QueuedRequest("fine", [7] * 5, RequestParams(max_tokens=BLOCK), time.time())
    assert queue.run(queue.ops.enqueue_all([bad, canvas, fine]))
    with make_worker(redis_server.url, service):
        done = wait_for(lambda: _done(queue, "bad"), what="the error")
        refused = wait_for(lambda: _done(queue, "canvas"), what="the sampler's error")
        assert wait_for(lambda: _done(queue, "fine"), what="the next answer").finish_reason != "error"
    assert (refused.finish_reason, refused.token_ids) == ("error", [])
    assert refused.error == "entropy_bound, t_min: not settings of LLaDA; leave them out"
    assert (done.finish_reason, done.token_ids, done.completion_tokens, done.meta) == (
        "error",
        [],
        0,
        {"custom_id": "line-1"},
    )
    assert done.error == "invalid request settings: top_p must be in (0, 1], got 7.0"


def test_a_result_holds_exactly_what_was_asked_for_with_its_usage_and_meta(
    redis_server, service, make_worker
):
    """43 tokens asked, not a whole number of 8-token blocks: the result holds exactly 43 tokens (and
    their log probabilities), says why it ended, counts the prompt and the completion, names the worker
    and passes the request's meta through (a batch line's custom id)."""
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    meta = {"custom_id": "line-7"}
    queued = QueuedRequest("r-43", [7] * 5, RequestParams(max_tokens=43, logprobs=1), time.time(), meta=meta)
    assert queue.run(queue.ops.enqueue(queued, 0))
    with make_worker(redis_server.url, service, ignore_eos=True) as worker:
        done = wait_for(lambda: _done(queue, "r-43"), what="the result")
    assert len(done.token_ids) == 43 and len(done.logprobs) == 43
    assert done.finish_reason == "length"  # ignore_eos: an EOS among them does not make it "stop"
    assert (done.prompt_tokens, done.completion_tokens) == (
        5,
        completion_tokens(done.token_ids, worker.eos_ids),
    )
    assert (done.worker, done.meta, done.error) == (worker.worker_id, meta, None)


def test_block_events_go_to_streaming_requests_only(redis_server, service, make_worker):
    """A client that waits for the whole result is woken once, by its result; a streaming one per block.
    Both have their progress recorded (a request resumed elsewhere keeps its blocks)."""
    with make_worker(redis_server.url, service, ignore_eos=True):
        queue = _enqueue(redis_server.url, service, "plain", 5, max_tokens=3 * BLOCK)
        _enqueue(redis_server.url, service, "streamed", 5, max_tokens=3 * BLOCK, stream=True)
        wait_for(lambda: _done(queue, "plain") and _done(queue, "streamed"), what="both results")
    kinds = {i: [type(e).__name__ for e in queue.events_of(i)] for i in ("plain", "streamed")}
    assert kinds == {"plain": ["DoneEvent"], "streamed": ["BlockEvent"] * 3 + ["DoneEvent"]}
    *blocks, done = queue.events_of("streamed")
    assert [(b.index, b.logprobs) for b in blocks] == [(0, None), (1, None), (2, None)]  # none asked
    assert [t for b in blocks for t in b.token_ids] == done.token_ids


def test_a_worker_keeps_nothing_of_the_requests_it_has_answered(redis_server, service, make_worker):
    """Bounded state: once each result is acknowledged, a streamed request, one with log probabilities and
    meta, and a cancelled one leave no entry behind in the worker (a long-running worker would grow)."""
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    requests = [
        QueuedRequest("streamed", [7] * 5, RequestParams(max_tokens=2 * BLOCK), time.time(), stream=True),
        QueuedRequest(
            "detailed",
            [7] * 6,
            RequestParams(max_tokens=BLOCK, logprobs=2),
            time.time(),
            meta={"custom_id": "a"},
        ),
        QueuedRequest(
            "cancelled", [7] * 7, RequestParams(max_tokens=64 * 8, logprobs=1), time.time(), stream=True
        ),
    ]
    with make_worker(redis_server.url, service, ignore_eos=True) as worker:
        for request in requests:
            assert queue.run(queue.ops.enqueue(request, 0))
        _wait_for_block(queue, "cancelled")
        queue.run(queue.ops.cancel("cancelled", 7))
        wait_for(lambda: all(_done(queue, r.id) for r in requests), what="every result")
        wait_for(lambda: not worker.engine.has_work() and not worker._outbox, what="acknowledgements")
        assert worker._served == {} and not worker.scheduler.requests
    assert _done(queue, "cancelled").finish_reason == "cancelled"


def test_a_request_that_can_never_fit_fails_clearly(redis_server, service, make_worker):
    with make_worker(redis_server.url, service, token_budget=200):
        queue = _enqueue(redis_server.url, service, "huge", 150, max_tokens=64)
        done = wait_for(lambda: _done(queue, "huge"), what="the rejection")
    assert done.finish_reason == "error" and "token budget" in done.error
    # nothing was generated, and the usage says so
    assert (done.token_ids, done.prompt_tokens, done.completion_tokens) == ([], 150, 0)


@pytest.mark.parametrize(
    "prompt, max_tokens, committed",
    [(1, 1, 0), (1, BLOCK, 0), (5, BLOCK + 1, 0), (40, 3 * BLOCK, BLOCK), (7, 2 * BLOCK, 2 * BLOCK)],
)
def test_a_candidate_is_shaped_with_the_sizes_of_the_request_it_stands_for(
    redis_server, service, make_worker, prompt, max_tokens, committed
):
    """The claim is decided on a candidate's shape (its sizes and wait as read from Redis, not its
    tokens): its prompt, blocks, prefix and widest row must be those of the request it stands for, at the
    boundaries (a one-token prompt, one token asked, exactly one block, one past it, blocks already
    committed), or a claim would pass over an admissible request or take one the budget cannot hold."""
    worker = make_worker(redis_server.url, service, token_budget=96).worker
    waited_s = 2.5
    shape = worker.claims.shape(Candidate("c", prompt + committed, prompt, max_tokens, waited_s))
    real = Request.from_tokens("c", [7] * prompt, tokens(max_tokens), BLOCK)
    real.generated = [7] * committed

    def sizes(request: Request) -> tuple:
        return request.prompt_len, request.max_blocks, request.prefix_len(), request.peak_width(BLOCK)

    assert sizes(shape) == sizes(real)
    assert worker.scheduler.fits(shape) == worker.scheduler.fits(real)
    assert abs(worker.scheduler.clock() - waited_s - shape.arrival_time) < 1.0


def test_an_eos_inside_an_ignore_eos_answer_neither_ends_nor_cuts_it(
    redis_server, service, make_worker, served_model, tmp_path
):
    """A token the model emits is made an EOS (the same checkpoint, its config naming that id): with
    ``ignore_eos`` the answer runs to max_tokens and ends for "length", the EOS kept inside it; without,
    it ends there for "stop"."""
    tokens = 3 * BLOCK
    probe = _enqueue(redis_server.url, service, "probe", 5, max_tokens=tokens)
    with make_worker(redis_server.url, service, ignore_eos=True):
        emitted = wait_for(lambda: _done(probe, "probe"), what="the probe").token_ids
    eos = emitted[BLOCK + 1]  # inside the second block: the answer goes on past it
    model = tmp_path / "eos-model"
    shutil.copytree(served_model, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"eos_token_id": eos}))
    reasons = {}
    for ignore_eos in (True, False):
        request_id = f"ignore-eos-{ignore_eos}"
        queue = _enqueue(redis_server.url, service, request_id, 5, max_tokens=tokens)
        with make_worker(redis_server.url, service, model_dir=model, ignore_eos=ignore_eos):
            done = wait_for(lambda: _done(queue, request_id), what="the answer")  # noqa: B023
        assert eos in done.token_ids, "the model did not emit the chosen EOS: the test proves nothing"
        reasons[ignore_eos] = (done.finish_reason, len(done.token_ids))
    assert reasons[True] == ("length", tokens)
    assert reasons[False][0] == "stop"


def test_worker_command_passes_its_admission_settings_to_its_scheduler(redis_server, service):
    argv = ["worker", "--redis", redis_server.url, "--service", service, "--min-padding-efficiency", "0.25"]
    argv += ["--max-wait", "1.5", "--max-rows", "7", "--admission", "projected", "--token-budget", "999"]
    with ExitStack() as held:
        worker = build_worker(build_parser().parse_args(argv), redis_server.url, service, held)
    assert worker.scheduler.config == SchedulerConfig(999, 7, "projected", 0.25, 1.5)
    assert worker.config.scheduling is worker.scheduler.config


def test_worker_command_rejects_a_padding_rule_outside_zero_to_one(capsys):
    argv = ["worker", "--redis", "redis://127.0.0.1:1", "--service", "s", "--min-padding-efficiency", "1.5"]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--min-padding-efficiency" in err[0]


def test_a_worker_given_a_checkpoint_of_another_family_exits_with_one_line_before_touching_redis():
    """No Redis answers at port 1: the refusal comes first, as the engine pod's last words."""
    argv = worker_command("builtin:tiny-llada", "redis://127.0.0.1:1/0", "s", "--family", "dream")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "dllm worker: error: builtin:tiny-llada is a llada checkpoint, not the dream one expected "
        "(--family dream, a DLLMService's spec.model.family): name its family, or another model"
    )


def test_a_worker_config_names_what_is_wrong_and_its_worker():
    settings = SchedulerConfig(1024)
    with pytest.raises(ValueError) as bad_policy:
        WorkerConfig("redis://127.0.0.1:1", "s", settings, policy="fastest")
    assert (
        str(bad_policy.value)
        == "policy must be one of blockserve, dllm-serve, static, sequential, got 'fastest'"
    )
    with pytest.raises(ValueError, match="^batch size must be positive, got 0$"):
        WorkerConfig("redis://127.0.0.1:1", "s", settings, policy="static", batch_size=0)
    assert WorkerConfig("redis://127.0.0.1:1", "s", settings, worker_id="w-1").resolved_id() == "w-1"
    unnamed = WorkerConfig("redis://127.0.0.1:1", "s", settings).resolved_id()
    assert unnamed == f"{socket.gethostname()}-{os.getpid()}"  # a pod's name and the process


def test_a_request_whose_stored_blocks_fill_its_budget_is_completed_as_it_is(
    redis_server, service, make_worker
):
    """A worker stored the last block but died (or lost Redis) before completing: whoever claims the
    request next must send those blocks, not generate one more."""
    queue = _enqueue(redis_server.url, service, "r-full", 5, max_tokens=16)  # two blocks of 8
    stored = [11] * 8 + [12] * 8
    assert queue.claim("gone", 100, 1)
    assert queue.progress("gone", "r-full", BlockEvent(1, [12] * 8), stored, 5 + 16)
    queue.redis.zadd(queue.ops.keys.inflight, {"r-full": 0})  # its lease ran out long ago
    with make_worker(redis_server.url, service) as worker:
        done = wait_for(lambda: _done(queue, "r-full"), what="the result")
        cycles = len(worker.engine.records)
    assert done.token_ids == stored and done.finish_reason == "length"
    assert done.completion_tokens == 16
    assert cycles == 0, "a block was generated for a request that had all of its blocks"


def test_a_worker_reclaiming_a_request_another_worker_took_further_takes_the_further_copy(
    redis_server, service, make_worker
):
    """Our lease lapsed (a Redis fault), another worker committed a block, and our claim won the request
    back: the copy from Redis, further along, replaces ours, and the answer goes on from its block."""
    thread = make_worker(redis_server.url, service, ignore_eos=True)
    worker = thread.worker
    queue = _enqueue(redis_server.url, service, "r-moved", 5, max_tokens=3 * BLOCK)
    (claimed,) = worker.queue.claim(worker.worker_id, 100, 1)
    worker._admit(claimed)
    further = [11] * BLOCK  # what the other worker committed meanwhile
    worker._admit(dataclasses.replace(claimed, generated=further))
    assert list(worker.scheduler.requests) == ["r-moved"]
    assert worker.scheduler.requests["r-moved"].generated == further
    assert _done(queue, "r-moved") is None, "no error result may be sent for a request we hold"
    with thread:
        done = wait_for(lambda: _done(queue, "r-moved"), what="the result")
    assert done.token_ids[:BLOCK] == further and len(done.token_ids) == 3 * BLOCK and done.error is None


def test_a_worker_reclaiming_a_request_it_still_holds_keeps_it(redis_server, service, make_worker):
    """After a Redis fault our lease may lapse and our own claim win it back: that is not a duplicate."""
    thread = make_worker(redis_server.url, service)
    worker = thread.worker
    queue = _enqueue(redis_server.url, service, "r-mine", 5, max_tokens=16)
    (claimed,) = worker.queue.claim(worker.worker_id, 100, 1)
    worker._admit(claimed)
    worker._admit(claimed)  # the same request claimed again by the same worker
    assert list(worker.scheduler.requests) == ["r-mine"]
    assert _done(queue, "r-mine") is None, "no error result may be sent for a request we hold"
    with thread:
        done = wait_for(lambda: _done(queue, "r-mine"), what="the result")
    assert done.finish_reason in ("stop", "length") and done.error is None


def _wait_for_block(queue: SyncQueue, request_id: str) -> None:
    """Until the worker recorded a committed block (a request that does not stream gets no block events:
    its progress is in its hash)."""
    wait_for(
        lambda: queue.redis.hget(queue.ops.keys.request(request_id), "generated") not in (b"[]", None),
        WAIT_S,
        0.01,
        what="a first committed block",
    )


def test_a_cancelled_request_stops_in_the_worker(redis_server, service, make_worker):
    """Cancelling an in-flight request must end it at the next block boundary, not at its budget."""
    with make_worker(redis_server.url, service, ignore_eos=True):
        queue = _enqueue(redis_server.url, service, "r-long", 5, max_tokens=64 * 8)
        _wait_for_block(queue, "r-long")
        assert queue.run(queue.ops.cancel("r-long", 5)) == 2  # in flight: flagged for its worker
        done = wait_for(lambda: _done(queue, "r-long"), what="the cancelled result")
    assert done.finish_reason == "cancelled"
    assert 8 <= len(done.token_ids) < 64 * 8


def test_a_worker_that_lost_a_lease_drops_the_request_and_never_answers_it(
    redis_server, service, make_worker
):
    """Another worker took the request over (what a reap and its claim leave behind: another owner in
    the request's record): the next exchange tells this worker, which drops the row, sends no more
    blocks and no result, and goes on serving; the new owner's result is the only one."""
    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    taken = QueuedRequest(
        "r-taken",
        [7] * 5,
        RequestParams(max_tokens=64 * 8, logprobs=1),
        time.time(),
        stream=True,
        meta={"a": 1},
    )
    with make_worker(redis_server.url, service, ignore_eos=True) as worker:
        assert queue.run(queue.ops.enqueue(taken, 0))
        _wait_for_block(queue, "r-taken")
        queue.redis.hset(queue.ops.keys.request("r-taken"), "worker", "other")
        cycles_before = len(worker.engine.records)
        wait_for(lambda: not worker.engine.has_work(), what="the row to be dropped")
        assert len(worker.engine.records) - cycles_before <= 2  # not run on to its last block (16)
        assert "r-taken" not in worker.scheduler.requests
        assert not _kept_about(worker, "r-taken"), "a dropped request left state behind"
        kept = json.loads(queue.redis.hget(queue.ops.keys.request("r-taken"), "generated"))
        assert len(kept) < 64 * 8  # dropped before it finished: no later block was recorded
        queue = _enqueue(redis_server.url, service, "r-next", 5)
        wait_for(lambda: _done(queue, "r-next"), what="the next request")
        assert _done(queue, "r-taken") is None
        theirs = DoneEvent(kept, "length", prompt_tokens=5, completion_tokens=len(kept), worker="other")
        assert queue.complete("other", "r-taken", theirs)
    assert [e.worker for e in queue.events_of("r-taken") if isinstance(e, DoneEvent)] == ["other"]


def test_a_request_cancelled_and_taken_over_between_an_exchange_and_the_renewal_is_dropped(
    redis_server, service, make_worker
):
    """The exchange that sends one cancelled result reports a second request cancelled (its result is
    staged for the next exchange); before the renewal that follows in the same pass, another worker takes
    that request over. The renewal reports it lost: the worker drops it with its staged result (nothing of
    it published, nothing left behind) and goes on serving."""
    with make_worker(redis_server.url, service, ignore_eos=True) as worker:
        queue = _enqueue(redis_server.url, service, "first", 5, max_tokens=64 * BLOCK)
        _enqueue(redis_server.url, service, "second", 6, max_tokens=64 * BLOCK)
        _wait_for_block(queue, "first")
        _wait_for_block(queue, "second")
        commit, taken = worker.queue.commit, []

        def cancelled_then_taken_over(worker_id, blocks, results, held):
            if [request_id for request_id, _ in results] == ["first"] and not taken:
                assert queue.run(queue.ops.cancel("second", 6)) == 2  # in flight: flagged
                reply = commit(worker_id, blocks, results, held)
                queue.redis.hset(queue.ops.keys.request("second"), "worker", "other")
                worker._last_renew = float("-inf")  # the renewal comes next in this pass
                taken.append(reply)
                return reply
            return commit(worker_id, blocks, results, held)

        worker.queue.commit = cancelled_then_taken_over
        assert queue.run(queue.ops.cancel("first", 5)) == 2
        wait_for(lambda: taken, what="the exchange that sends the first cancellation")
        assert "second" in taken[0].cancelled, "the scenario did not arise"
        _enqueue(redis_server.url, service, "next", 5)
        wait_for(lambda: _done(queue, "next"), what="the next request")
        assert not _kept_about(worker, "second"), "a dropped request left state behind"
        assert "second" not in worker.scheduler.requests
    assert _done(queue, "first").finish_reason == "cancelled"
    assert _done(queue, "second") is None  # the other worker's to answer


def test_drain_lets_work_in_flight_finish_here_within_its_timeout(redis_server, service, make_worker):
    """SIGTERM (drain) with time to spare: nothing new is claimed, and the request in flight is finished
    by this worker, whole, rather than handed back."""
    with make_worker(redis_server.url, service, ignore_eos=True) as worker:
        queue = _enqueue(redis_server.url, service, "r-finish", 5, max_tokens=64 * 8)
        _wait_for_block(queue, "r-finish")
        worker.drain()  # its drain timeout: 60 s
        _enqueue(redis_server.url, service, "r-later", 5)
        done = wait_for(lambda: _done(queue, "r-finish"), what="the request in flight")
        wait_for(lambda: worker.stopped, what="the drained worker to stop")
    assert (len(done.token_ids), done.finish_reason, done.worker) == (64 * 8, "length", worker.worker_id)
    assert _done(queue, "r-later") is None and queue.depth() == (1, 0)  # left for another worker


def test_a_request_outliving_many_leases_keeps_its_one_lease_renewed(redis_server, service, make_worker):
    """Leases of 500 ms, renewed every 167 ms: a request that takes several leases to finish is claimed
    once and finished by its worker; without renewal its own reaping would take it back mid-run."""
    lease_s, tokens = 0.5, 64 * 31  # 62 blocks of 32 steps each: about 2-3 s on these cores
    with make_worker(
        redis_server.url,
        service,
        worker={"lease_ms": int(lease_s * 1000)},
        ignore_eos=True,
        remasking="low_confidence",  # every block takes its 32 steps
    ) as worker:
        queue = _enqueue(redis_server.url, service, "r-slow", 5, max_tokens=tokens)
        started = time.monotonic()
        done = wait_for(lambda: _done(queue, "r-slow"), 120, what="the slow request")
        took = time.monotonic() - started
        claims = sum(record.admitted for record in worker.engine.records)
    assert took > 2 * lease_s, f"the request took {took:.2f} s, under two leases: the test proves nothing"
    assert claims == 1 and done.worker == worker.worker_id and len(done.token_ids) == tokens


def test_drain_hands_unfinished_work_back_with_its_blocks(redis_server, service, served_model):
    """SIGTERM with a short drain timeout: the request returns to the queue at once, blocks kept."""
    from dllm_contracts.scheduler_config import SchedulerConfig
    from engine_pod.decoding.config import DecodingConfig
    from engine_pod.loading.loader import load_model
    from engine_pod.runner.factory import make_runner
    from engine_pod.worker.config import WorkerConfig
    from engine_pod.worker.worker import Worker
    from tests.serving.conftest import WorkerThread
    from tests.serving_utils import BLOCK

    loaded = load_model(str(served_model))
    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK, ignore_eos=True)
    config = WorkerConfig(
        redis_server.url, service, SchedulerConfig(2048), lease_ms=60_000, drain_timeout_s=0.0
    )
    thread = WorkerThread(Worker(make_runner(loaded, decoding), config))
    with thread:
        queue = _enqueue(redis_server.url, service, "r-back", 5, max_tokens=64 * 8)
        _wait_for_block(queue, "r-back")
    assert not thread.thread.is_alive()
    record = queue.redis.hgetall(queue.ops.keys.request("r-back"))
    assert record[b"state"] == b"pending"  # not left in flight until a 60 s lease expires
    assert queue.redis.zscore(queue.ops.keys.pending, "r-back") is not None
    kept = json.loads(record[b"generated"])
    assert kept and len(kept) % BLOCK == 0 and len(kept) < 64 * 8
    (claimed,) = queue.claim("next", 10_000, 1)
    assert claimed.generated == kept


def _logprobs_worker(url: str, service: str, loaded, drain_timeout_s: float):
    from engine_pod.decoding.config import DecodingConfig
    from engine_pod.runner.factory import make_runner
    from engine_pod.worker.config import WorkerConfig
    from engine_pod.worker.worker import Worker
    from tests.serving.conftest import WorkerThread

    decoding = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK, ignore_eos=True)
    config = WorkerConfig(
        url, service, SchedulerConfig(2048), lease_ms=60_000, drain_timeout_s=drain_timeout_s
    )
    return WorkerThread(Worker(make_runner(loaded, decoding), config))


def test_log_probabilities_survive_a_hand_over(redis_server, service, served_model):
    """A request asking for log probabilities, handed back mid-way by a draining worker and finished by
    another: every token has its entry, equal to an uninterrupted run's (greedy), stream events too."""
    from engine_pod.loading.loader import load_model

    loaded = load_model(str(served_model))
    tokens = 64 * 8

    def request(request_id: str) -> QueuedRequest:
        return QueuedRequest(
            request_id, [7] * 5, RequestParams(max_tokens=tokens, logprobs=2), time.time(), stream=True
        )

    queue = SyncQueue(redis.Redis.from_url(redis_server.url), QueueOps(service))
    with _logprobs_worker(redis_server.url, service, loaded, 30.0):
        assert queue.run(queue.ops.enqueue(request("r-whole"), 0))
        wait_for(lambda: _done(queue, "r-whole"), 120, 0.05, what="the uninterrupted result")
    with _logprobs_worker(redis_server.url, service, loaded, 0.0):  # drains at once: hands it back
        assert queue.run(queue.ops.enqueue(request("r-handed"), 0))
        _wait_for_block(queue, "r-handed")
    kept = json.loads(queue.redis.hget(queue.ops.keys.request("r-handed"), "generated"))
    assert 0 < len(kept) < tokens, "the first worker should hand back a part-done request"
    with _logprobs_worker(redis_server.url, service, loaded, 30.0):
        wait_for(lambda: _done(queue, "r-handed"), 120, 0.05, what="the handed-over result")
    whole, handed = _done(queue, "r-whole"), _done(queue, "r-handed")
    assert handed.token_ids == whole.token_ids and len(handed.logprobs) == tokens
    assert None not in handed.logprobs
    for mine, reference in zip(handed.logprobs, whole.logprobs):
        assert mine[0] == pytest.approx(reference[0], abs=1e-5)
        assert [i for i, _ in mine[1]] == [i for i, _ in reference[1]]
    streamed = [e for e in queue.events_of("r-handed") if isinstance(e, BlockEvent)]
    assert all(len(e.logprobs) == len(e.token_ids) for e in streamed)
    assert not [f for f in queue.redis.hkeys(queue.ops.keys.request("r-handed")) if f.startswith(b"lp:")]


def test_dllm_worker_is_alive_while_its_model_loads(served_model, redis_server, service, tmp_path):
    """The probe server starts before the model loads: a slow download answers /healthz (a liveness probe
    does not restart it) while /startupz and /readyz say it is not serving yet."""
    gate, port = tmp_path / "download-finished", free_port()
    env = {
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "gated_load"), str(ROOT)]),
        "DLLM_TEST_LOAD_GATE": str(gate),
    }
    command = worker_command(served_model, redis_server.url, service)
    command[command.index("--port") + 1] = str(port)
    worker = subprocess.Popen(
        command, env=os.environ | env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _status(f"{base}/healthz") == 200, what="/healthz while the model loads")
        assert _status(f"{base}/startupz") == 503 and _status(f"{base}/readyz") == 503
        gate.touch()
        wait_for(lambda: _status(f"{base}/startupz") == 200, what="/startupz once loaded")
        wait_for(lambda: _status(f"{base}/readyz") == 200, what="/readyz once loaded")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr.decode()[-2000:]


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def test_a_worker_is_unready_while_redis_is_down_and_serves_again_once_it_is_back(
    redis_server, service, make_worker
):
    """Redis killed under an idle worker: the worker stays up, reports not ready, and serves a request
    enqueued after Redis came back on the same port (the worker's client reconnects by itself)."""
    with make_worker(redis_server.url, service) as worker:
        queue = _enqueue(redis_server.url, service, "before", 5)
        wait_for(lambda: _done(queue, "before"), what="the first request to finish")
        assert worker.ready()
        redis_server.kill()
        wait_for(lambda: not worker.ready(), what="the worker to report not ready")
        wait_for(lambda: not worker.redis_link.connected, what="the worker's loop to notice the fault")
        assert not worker.stopped
        with RedisServer(port=redis_server.port):
            queue = _enqueue(redis_server.url, service, "after", 5)
            wait_for(lambda: _done(queue, "after"), what="the request sent after the restart")
            wait_for(worker.ready, what="the worker to report ready again")
            assert _done(queue, "after").finish_reason in ("stop", "length")


def test_the_readiness_probe_asks_redis_itself(redis_server, service, make_worker):
    """Between two iterations of the loop (a long block cycle on a GPU) only the probe's own ping can
    tell that Redis is gone."""
    worker = make_worker(redis_server.url, service).worker  # built, its loop not started
    assert worker.ready()
    redis_server.kill()
    assert worker.redis_link.connected and not worker.ready()


def test_a_pause_in_arrivals_ends_the_batch_window(redis_server, service, make_worker):
    """The batch window ends at the first pause in arrivals (20 ms), not at its full length: a request
    that arrives alone starts its cycle alone, and one sent 0.5 s later, well inside a 1 s window,
    joins later (a window that ran its full length would have started both together)."""
    with make_worker(redis_server.url, service, scheduling={"batch_window_s": 1.0}) as worker:
        time.sleep(0.5)  # idle, subscribed to the wakeups
        queue = _enqueue(redis_server.url, service, "first", 5, max_tokens=64)
        time.sleep(0.5)
        _enqueue(redis_server.url, service, "second", 5)
        wait_for(lambda: _done(queue, "first") and _done(queue, "second"), what="both requests")
        assert worker.engine.records[0].admitted == 1
