"""The engine worker: BlockServe admission drawing from Redis, results published per request.

Each loop iteration: send what Redis has not acknowledged, renew our leases, reap expired ones, claim
what the scheduler would admit now (it reads the candidates' sizes and waits first, so a claimed request
is always admissible), run one block cycle, then, in one round trip, record every committed block,
complete finished requests exactly once and learn which held requests were cancelled.
SIGTERM stops claiming; in-flight work finishes within the drain timeout or goes back to the queue
with its committed blocks.

Redis faults are ridden out (DESIGN.md section 8): a connection error or timeout ends the iteration,
the loop backs off (bounded, jittered) and reports not ready, and the rows it holds stay in memory.
Finished results wait in an outbox until Redis acknowledges them, their leases renewed meanwhile;
a lease another worker took over while we were cut off is dropped, so every result is still
delivered exactly once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import time
from dataclasses import dataclass

import redis

from dllm_contracts.heap import freeze_loaded_objects
from dllm_contracts.queue.messages import BATCH_META, BlockEvent, DoneEvent
from dllm_contracts.queue.ops import ANY_WAIT, RESULT_TTL_S, BlockCommit, Candidate, Claimed
from dllm_contracts.queue.resilience import TRANSIENT_ERRORS, Backoff
from dllm_contracts.queue.sync_client import CLAIM_ROUNDS, SyncQueue
from dllm_contracts.scheduler_config import BURST_QUIET_S, SchedulerConfig
from dllm_contracts.text import completion_tokens, within_limit
from engine_pod.decoding.sampling_params import SamplingError, SamplingParams
from engine_pod.engine import Engine, StepResult
from engine_pod.runner.contract import Runner
from engine_pod.scheduler.request import Request, RequestError
from engine_pod.scheduler.serving import SERVING_POLICIES, serving_scheduler
from engine_pod.worker.metrics import WorkerMetrics

logger = logging.getLogger(__name__)

RECORD_WINDOW = 1024  # block cycles a long-running worker remembers (bounded memory)
FINISHED_REASONS = ("stop", "length")  # a generation that ran to its end (not cancelled, not refused)
AGED_READ = 8  # requests waiting past the bound read per claim (the oldest first)


@dataclass(frozen=True)
class WorkerConfig:
    redis_url: str
    service: str
    scheduling: SchedulerConfig  # token budget and admission: the scheduler decides what to claim
    worker_id: str = ""
    # blockserve, or a baseline behind the same queue (measured side by side): static (batches of
    # ``batch_size`` in arrival order, each run until its slowest row is done) or sequential
    policy: str = "blockserve"
    batch_size: int = 1  # static's
    lease_ms: int = 30_000
    idle_wait_s: float = 0.2  # longest wait for new work when idle
    drain_timeout_s: float = 60.0  # after SIGTERM: time to finish in-flight work before handing it back
    result_ttl_s: int = RESULT_TTL_S  # how long a finished request's record and result stay in Redis

    def __post_init__(self) -> None:
        if self.policy not in SERVING_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(SERVING_POLICIES)}, got {self.policy!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be positive, got {self.batch_size}")

    def resolved_id(self) -> str:
        return self.worker_id or f"{socket.gethostname()}-{os.getpid()}"


class Worker:
    def __init__(self, runner: Runner, config: WorkerConfig, queue: SyncQueue | None = None) -> None:
        self.config = config
        self.worker_id = config.resolved_id()
        self.queue = queue or SyncQueue.connect(
            config.redis_url, config.service, config.lease_ms, config.result_ttl_s
        )
        self.decoding = runner.decoding
        self.eos_ids = runner.loaded.config.eos_token_ids
        self.scheduler = serving_scheduler(
            config.policy,
            self.decoding.block_length,
            self.eos_ids,
            config.scheduling,
            config.batch_size,
            ignore_eos=self.decoding.ignore_eos,
            canvas=self.decoding.canvas,
            clock=time.monotonic,
        )
        self.engine = Engine(runner, self.scheduler, record_window=RECORD_WINDOW)
        self.metrics = WorkerMetrics()
        self.metrics.token_budget.set(config.scheduling.token_budget)
        self.draining = False
        self.stopped = False
        self.connected = True  # False from a Redis fault until the next iteration that reaches Redis
        self._backoff = Backoff()
        self._drain_deadline: float | None = None
        self._last_renew = 0.0
        self._last_reap = 0.0
        self._pubsub = None
        self._subscribed = False
        self.burst_quiet_s = BURST_QUIET_S  # the pause in arrivals that ends a batch window
        self.in_batch_window = False  # woken by new work, waiting while more keeps arriving
        self._meta: dict[str, dict] = {}  # request id -> payload meta, echoed in its done event
        self._streaming: set[str] = set()  # requests whose clients read each block (others: the result)
        self._max_tokens: dict[str, int] = {}  # request id -> its max_tokens: results are cut to it
        self._logprobs: dict[str, list] = {}  # request id -> per committed token (those that asked)
        self._outbox: dict[str, DoneEvent] = {}  # finished, not yet acknowledged by Redis
        self._unsent: list[BlockCommit] = []  # committed blocks Redis has not recorded yet (a fault)

    # -- lifecycle ----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.drain())
        signal.signal(signal.SIGINT, lambda *_: self.drain())

    def drain(self) -> None:
        if not self.draining:
            logger.info("worker %s draining: no new claims", self.worker_id)
            self._drain_deadline = time.monotonic() + self.config.drain_timeout_s
        self.draining = True

    def ready(self) -> bool:
        if self.draining or self.stopped or not self.connected:
            return False
        try:
            return bool(self.queue.redis.ping())
        except redis.RedisError:
            return False

    def run(self) -> None:
        """Serve until drained (SIGTERM) and the work in flight is done or its drain timeout has passed."""
        freeze_loaded_objects()
        self._pubsub = self.queue.redis.pubsub(ignore_subscribe_messages=True)
        try:
            while not self._should_stop():
                try:
                    self._iterate()
                    self._redis_reached()
                except TRANSIENT_ERRORS as exc:
                    self._redis_fault(exc)
        finally:
            self._close()

    def _should_stop(self) -> bool:
        if self._drain_deadline is not None and time.monotonic() > self._drain_deadline:
            return True
        return self.draining and not (self.engine.has_work() or self._outbox or self._unsent)

    def _iterate(self) -> None:
        """One pass of the loop."""
        if self._outbox or self._unsent:  # left over from a Redis fault
            self._commit()
        self._housekeeping()
        if not self.draining:
            self._claim()
        if self.engine.has_work():
            self._step()
        elif not self.draining:
            self._wait_for_work()

    def _redis_reached(self) -> None:
        if self._backoff.failing:
            logger.info("worker %s reached Redis again", self.worker_id)
        self._backoff.reset()
        self.connected = True

    def _redis_fault(self, exc: Exception) -> None:
        if not self._backoff.failing:
            logger.warning(
                "worker %s cannot reach Redis (%s: %s); keeping %d rows and %d results, retrying",
                self.worker_id,
                type(exc).__name__,
                exc,
                len(self._held()),
                len(self._outbox),
            )
        self.connected = False
        time.sleep(self._backoff.next_delay())

    def _close(self) -> None:
        try:
            self._hand_back_unfinished()
            self._commit()
        except TRANSIENT_ERRORS as exc:
            logger.warning(
                "worker %s stopped without reaching Redis (%s); its leases expire and the queue takes "
                "their requests back",
                self.worker_id,
                exc,
            )
        with contextlib.suppress(redis.RedisError):
            self._pubsub.close()
        self.stopped = True
        logger.info("worker %s stopped", self.worker_id)

    # -- the loop's parts ---------------------------------------------------------------------
    def _held(self) -> list[Request]:
        return list(self.scheduler.requests.values())

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_renew > self.config.lease_ms / 3000:  # renew before reaping: after an
            self._renew()  # outage our own leases have expired, and they are still ours to keep
            self._last_renew = now
        if now - self._last_reap > self.config.lease_ms / 3000:
            self.queue.reap()
            self._last_reap = now
            pending, inflight = self.queue.depth()
            self.metrics.queue_depth.labels("pending").set(pending)
            self.metrics.queue_depth.labels("inflight").set(inflight)

    def _renew(self) -> None:
        held = [r.request_id for r in self._held()] + list(self._outbox)
        for request_id in self.queue.renew(self.worker_id, held):
            logger.warning("lost the lease of %s; dropping it", request_id)
            self._drop(request_id)

    def _claim(self) -> None:
        """Claim what the scheduler would admit now: it plans the read (how many, how wide), chooses
        among the candidates read (sizes, waits) and every claimed request joins the next cycle. A claim
        that lost some candidates to another worker can leave one the scheduler no longer admits: it goes
        straight back. Requests that can never fit the budget are claimed to be answered with an error."""
        for _ in range(CLAIM_ROUNDS):
            plan = self.scheduler.claim_plan()
            if plan is None:
                return
            scheduling = self.config.scheduling
            if plan.oldest_first:
                read = self.queue.candidates(0, 0, ANY_WAIT, plan.count, batch_room=self._batch_room())
            else:
                read = self.queue.candidates(
                    plan.max_prefix,
                    plan.count,
                    scheduling.max_wait_s,
                    AGED_READ,
                    scheduling.batch_max_wait_s,
                    self._batch_room(),
                )
            candidates = {c.id: c for c in [*read.aged, *read.shortest]}
            shapes = {c.id: self._shape(c) for c in candidates.values()}
            chosen = [r.request_id for r in self.scheduler.choose(list(shapes.values()))]
            chosen += [i for i, shape in shapes.items() if not self.scheduler.fits(shape)]
            claimed = self.queue.claim_chosen(self.worker_id, [(i, candidates[i].prefix) for i in chosen])
            for item in claimed:
                self._admit(item, shapes[item.request.id].arrival_time)
            self._hand_back_unadmittable({item.request.id for item in claimed})
            if not chosen or (len(claimed) == len(chosen) and len(read.shortest) < plan.count):
                return  # nothing more is admissible, or the queue has nothing more to offer

    def _batch_room(self) -> int | None:
        """How many more batch lines this worker may take now (None: no bound but its budget)."""
        cap = self.config.scheduling.batch_max_rows
        if not cap:
            return None
        return max(0, cap - sum(1 for meta in self._meta.values() if meta.get(BATCH_META)))

    def _shape(self, candidate: Candidate) -> Request:
        """A candidate as the scheduler sees it: its sizes and its wait, not its tokens (not claimed yet)."""
        L = self.decoding.block_length
        shape = Request(
            candidate.id,
            (0,) * max(1, candidate.prompt_tokens),
            max(1, math.ceil(candidate.max_tokens / L)),
            arrival_time=self.scheduler.clock() - candidate.waited_s,
        )
        shape.generated = [0] * max(0, candidate.prefix - candidate.prompt_tokens)
        return shape

    def _hand_back_unadmittable(self, just_claimed: set[str]) -> None:
        for request in self.scheduler.unadmittable():
            if request.request_id in just_claimed:
                logger.info("handing %s back: another worker took part of the claim", request.request_id)
                self.queue.release(
                    self.worker_id, request.request_id, request.generated, request.prefix_len()
                )
                self._drop(request.request_id)

    def _admit(self, claimed: Claimed, arrival_time: float | None = None) -> None:
        payload = claimed.request
        held = self.scheduler.requests.get(payload.id)
        if held is not None:  # our lease lapsed during a Redis fault and we claimed it back
            if len(claimed.generated) <= len(held.generated):
                return  # the copy we hold is as far along: keep it
            self.scheduler.cancel(payload.id)
        request = Request.from_tokens(
            payload.id, payload.prompt_ids, payload.max_tokens, self.decoding.block_length, arrival_time
        )
        request.generated = list(claimed.generated)
        request.threshold = payload.threshold
        request.logprobs = payload.logprobs
        if payload.logprobs is not None:  # blocks committed elsewhere: as recorded in Redis
            restored = claimed.logprobs[: len(claimed.generated)]
            self._logprobs[payload.id] = restored + [None] * (len(claimed.generated) - len(restored))
        try:
            request.sampling = SamplingParams.from_dict(payload.sampling)
        except (SamplingError, TypeError) as exc:
            self._meta[payload.id] = payload.meta
            self._publish_done(request, "error", f"invalid sampling settings: {exc}")
            return
        self._meta[payload.id] = payload.meta
        self._max_tokens[payload.id] = payload.max_tokens
        if payload.stream:
            self._streaming.add(payload.id)
        finished = self.scheduler.finish_reason_for(request)
        if finished is not None:  # its last block was stored, its result was not: send it as it is
            self._publish_done(request, finished.value)
            return
        try:
            self.scheduler.add(request)
        except RequestError as exc:
            logger.warning("rejecting %s: %s", payload.id, exc)
            self._publish_done(request, "error", str(exc))

    def _wait_for_work(self) -> None:
        if not self._subscribed:  # once: after a dropped connection redis-py subscribes again itself
            self._pubsub.subscribe(self.queue.ops.keys.wakeup)
            self._subscribed = True
        if self._arrivals_within(self.config.idle_wait_s):
            self._let_the_burst_in()

    def _let_the_burst_in(self) -> None:
        """Work came to an idle worker: while more keeps arriving (a burst on its way through the
        gateway), wait, up to the batch window, so that the first cycle takes the burst and not only its
        first request (the rest would join a block later and finish a cycle later). Every enqueue
        publishes a wakeup, so the pause that ends the window is timed from the last arrival itself
        (sampling the queue's depth every BURST_QUIET_S ended it up to twice that late)."""
        window = self.config.scheduling.batch_window_s
        give_up = time.monotonic() + window
        self.in_batch_window = True
        try:
            while (left := give_up - time.monotonic()) > 0:
                if not self._arrivals_within(min(self.burst_quiet_s, left)):
                    return
        finally:
            self.in_batch_window = False

    def _arrivals_within(self, timeout: float) -> bool:
        """Whether a wakeup comes within ``timeout`` seconds; those already delivered are read with it."""
        if self._pubsub.get_message(timeout=timeout) is None:
            return False
        while self._pubsub.get_message() is not None:
            pass
        return True

    def _step(self) -> None:
        begin = time.perf_counter()
        result = self.engine.step()
        if result.output.is_empty:
            return
        self._unsent += self._committed_blocks(result)
        for request in result.finished:
            self._stage_done(request, request.finish_reason.value if request.finish_reason else "length")
        self._commit()
        record = self.engine.records[-1]
        self.metrics.record_cycle(
            record.rows,
            record.box_width,
            time.perf_counter() - begin,
            record.useful_positions,
            record.computed_positions,
            record.preempted,
        )
        cache = getattr(self.engine.runner, "prefix_cache", None)
        if cache is not None:
            self.metrics.record_prefix_cache(cache.stats, self.engine.runner.hits)

    def _committed_blocks(self, result: StepResult) -> list[BlockCommit]:
        """What this cycle committed, per active row: its progress, its block event for a streaming client
        and, for a request that asked, the block's log probabilities (kept here for the result and in
        Redis for a worker that takes the request over)."""
        requests = {r.request_id: r for r in result.finished} | self.scheduler.requests
        per_row = result.logprobs or [None] * len(result.blocks)
        blocks = []
        for request_id, row, block, values in zip(
            result.output.request_ids, result.output.rows, result.blocks, per_row
        ):
            request = requests.get(request_id)
            if not row.active or request is None:
                continue
            index = request.blocks_done(self.decoding.block_length) - 1
            kept = self._logprobs.get(request_id)
            logprobs = None
            if kept is not None:
                logprobs = list(values) if values is not None else [None] * len(block)
                kept.extend(logprobs)
            event = None
            if request_id in self._streaming:
                event = BlockEvent(index, list(block), logprobs, offset=len(request.generated) - len(block))
            commit = BlockCommit(
                request_id, event, list(request.generated), request.prefix_len(), index, logprobs
            )
            blocks.append(commit)
        return blocks

    def _commit(self) -> None:
        """Everything Redis has not acknowledged, in one round trip: blocks (in order), results, and the
        question which held requests were cancelled. On a fault it all stays here for the next try."""
        results = list(self._outbox.items())
        reply = self.queue.commit(self.worker_id, self._unsent, results, [r.request_id for r in self._held()])
        self._unsent = []
        for request_id in reply.lost:
            logger.warning("lost %s before publishing its block; dropping it", request_id)
            self._drop(request_id)
        for request_id, done in results:
            if reply.completed.get(request_id):
                self.metrics.requests.labels(done.finish_reason).inc()
                self.metrics.generated_tokens.inc(done.completion_tokens)
            else:
                logger.info("%s was completed or taken over elsewhere; dropping our result", request_id)
            self._outbox.pop(request_id, None)
        for request_id in reply.cancelled:
            request = self.scheduler.cancel(request_id)
            if request is not None:
                self._stage_done(request, "cancelled")  # sent with the next cycle's exchange

    def _drop(self, request_id: str) -> None:
        """Forget a request another worker now owns: its row, its staged result, its meta."""
        self.scheduler.cancel(request_id)
        self._outbox.pop(request_id, None)
        self._meta.pop(request_id, None)
        self._max_tokens.pop(request_id, None)
        self._logprobs.pop(request_id, None)
        self._streaming.discard(request_id)

    def _publish_done(self, request: Request, reason: str, error: str | None = None) -> None:
        self._stage_done(request, reason, error)
        self._commit()

    def _stage_done(self, request: Request, reason: str, error: str | None = None) -> None:
        generated, limit = request.generated, self._max_tokens.pop(request.request_id, None)
        logprobs = self._logprobs.pop(request.request_id, None)
        if limit is not None and reason in FINISHED_REASONS:  # exactly max_tokens, as OpenAI's API says
            generated, reason = within_limit(generated, limit, self.eos_ids, self.decoding.ignore_eos)
        if logprobs is not None:
            logprobs = logprobs[: len(generated)]
        done = DoneEvent(
            token_ids=list(generated),
            finish_reason=reason,
            prompt_tokens=request.prompt_len,
            completion_tokens=completion_tokens(generated, self.eos_ids),  # 0 for none
            worker=self.worker_id,
            error=error,
            meta=self._meta.pop(request.request_id, {}),
            logprobs=logprobs,
        )
        self._streaming.discard(request.request_id)
        self._outbox[request.request_id] = done

    def _hand_back_unfinished(self) -> None:
        """Release what we hold (a draining worker; the scheduler holds no finished or cancelled request);
        Redis faults here end the attempt (leases expire)."""
        for request in self._held():
            self.queue.release(self.worker_id, request.request_id, request.generated, request.prefix_len())
            self.scheduler.cancel(request.request_id)
            logger.info(
                "handed %s back to the queue with %d tokens", request.request_id, len(request.generated)
            )
