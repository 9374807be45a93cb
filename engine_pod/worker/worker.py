"""The engine worker: BlockServe admission drawing from Redis, results published per request.

Each loop iteration: send results not yet acknowledged, renew our leases, reap expired ones,
honour cancellations, claim what fits the token budget (sand filling through the claim script), run
one block cycle, then publish every committed block and complete finished requests exactly once.
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
import os
import signal
import socket
import time
from dataclasses import dataclass

import redis

from engine_pod.engine import Engine, StepResult
from engine_pod.queue.messages import BlockEvent, DoneEvent
from engine_pod.queue.ops import RESULT_TTL_S, Claimed
from engine_pod.queue.resilience import TRANSIENT_ERRORS, Backoff
from engine_pod.queue.sync_client import SyncQueue
from engine_pod.runner.block_cycle import BlockCycleRunner
from engine_pod.scheduler.blockserve import DEFAULT_MIN_PADDING_EFFICIENCY, BlockServeScheduler
from engine_pod.scheduler.request import Request, RequestError, RequestState
from engine_pod.text import completion_tokens
from engine_pod.worker.metrics import WorkerMetrics

logger = logging.getLogger(__name__)

RECORD_WINDOW = 1024  # block cycles a long-running worker remembers (bounded memory)


@dataclass(frozen=True)
class WorkerConfig:
    redis_url: str
    service: str
    token_budget: int
    worker_id: str = ""
    max_rows: int = 256
    admission: str = "preempt"
    min_padding_efficiency: float = DEFAULT_MIN_PADDING_EFFICIENCY  # BlockServe's widening rule
    lease_ms: int = 30_000
    idle_wait_s: float = 0.2  # longest wait for new work when idle
    drain_timeout_s: float = 60.0  # after SIGTERM: time to finish in-flight work before handing it back
    claim_batch: int = 32  # most requests claimed in one script call
    result_ttl_s: int = RESULT_TTL_S  # how long a finished request's record and result stay in Redis

    def resolved_id(self) -> str:
        return self.worker_id or f"{socket.gethostname()}-{os.getpid()}"


class Worker:
    def __init__(
        self, runner: BlockCycleRunner, config: WorkerConfig, queue: SyncQueue | None = None
    ) -> None:
        self.config = config
        self.worker_id = config.resolved_id()
        self.queue = queue or SyncQueue.connect(
            config.redis_url, config.service, config.lease_ms, config.result_ttl_s
        )
        self.decoding = runner.decoding
        self.eos_ids = runner.loaded.config.eos_token_ids
        self.scheduler = BlockServeScheduler(
            self.decoding.block_length,
            self.eos_ids,
            token_budget=config.token_budget,
            max_rows=config.max_rows,
            admission=config.admission,
            min_padding_efficiency=config.min_padding_efficiency,
            ignore_eos=self.decoding.ignore_eos,
            canvas=self.decoding.canvas,
        )
        self.engine = Engine(runner, self.scheduler, record_window=RECORD_WINDOW)
        self.metrics = WorkerMetrics()
        self.metrics.token_budget.set(config.token_budget)
        self.draining = False
        self.stopped = False
        self.connected = True  # False from a Redis fault until the next iteration that reaches Redis
        self._backoff = Backoff()
        self._drain_deadline: float | None = None
        self._last_renew = 0.0
        self._last_reap = 0.0
        self._pubsub = None
        self._subscribed = False
        self._meta: dict[str, dict] = {}  # request id -> payload meta, echoed in its done event
        self._outbox: dict[str, DoneEvent] = {}  # finished, not yet acknowledged by Redis

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

    def run(self, max_idle_s: float | None = None) -> None:
        """Serve until drained (SIGTERM) or, with ``max_idle_s``, until idle that long."""
        self._pubsub = self.queue.redis.pubsub(ignore_subscribe_messages=True)
        idle_since = time.monotonic()
        try:
            while not self._should_stop(idle_since, max_idle_s):
                try:
                    if self._iterate():
                        idle_since = time.monotonic()
                    self._redis_reached()
                except TRANSIENT_ERRORS as exc:
                    self._redis_fault(exc)
        finally:
            self._close()

    def _should_stop(self, idle_since: float, max_idle_s: float | None) -> bool:
        if self._drain_deadline is not None and time.monotonic() > self._drain_deadline:
            return True
        if self.engine.has_work() or self._outbox:
            return False
        if self.draining:
            return True
        return max_idle_s is not None and time.monotonic() - idle_since > max_idle_s

    def _iterate(self) -> bool:
        """One pass of the loop; True when it ran a block cycle."""
        self._flush_outbox()
        self._housekeeping()
        if not self.draining:
            self._claim()
        if self.engine.has_work():
            self._step()
            return True
        if not self.draining:
            self._wait_for_work()
        return False

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
            self._flush_outbox()
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
        for request_id in self.queue.cancelled_among([r.request_id for r in self._held()]):
            request = self.scheduler.cancel(request_id)
            if request is not None:
                self._publish_done(request, "cancelled")

    def _renew(self) -> None:
        held = [r.request_id for r in self._held()] + list(self._outbox)
        for request_id in self.queue.renew(self.worker_id, held):
            logger.warning("lost the lease of %s; dropping it", request_id)
            self._drop(request_id)

    def _claim(self) -> None:
        """Sand filling: as many rows as fit, each as wide as the budget allows for that many.

        Claiming n more rows caps every width at budget // (held + n); when fewer than n fit under that
        cap, try half as many, each allowed to be twice as wide, down to one.
        """
        L = self.decoding.block_length
        count = self._claim_count()
        while count >= 1:
            held = self._held()
            box = max((self.scheduler.row_width(r) for r in held), default=0)
            cap = self.config.token_budget // (len(held) + count)
            claimed = self.queue.claim(self.worker_id, cap - L, count) if cap >= max(box, L + 1) else []
            for item in claimed:
                self._admit(item)
            count = self._claim_count() if claimed and len(claimed) == count else count // 2

    def _claim_count(self) -> int:
        return min(self.config.max_rows - len(self._held()), self.config.claim_batch)

    def _admit(self, claimed: Claimed) -> None:
        payload = claimed.request
        held = self.scheduler.requests.get(payload.id)
        if held is not None:  # our lease lapsed during a Redis fault and we claimed it back
            if len(claimed.generated) <= len(held.generated):
                return  # the copy we hold is as far along: keep it
            self.scheduler.cancel(payload.id)
        request = Request.from_tokens(
            payload.id, payload.prompt_ids, payload.max_tokens, self.decoding.block_length
        )
        request.generated = list(claimed.generated)
        request.threshold = payload.threshold
        self._meta[payload.id] = payload.meta
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
        self._pubsub.get_message(timeout=self.config.idle_wait_s)

    def _step(self) -> None:
        begin = time.perf_counter()
        result = self.engine.step()
        if result.output.is_empty:
            return
        try:
            self._publish_blocks(result)
        finally:  # even when Redis failed mid-way: the results wait in the outbox, not lost
            for request in result.finished:
                self._stage_done(request, request.finish_reason.value if request.finish_reason else "length")
        self._flush_outbox()
        record = self.engine.records[-1]
        self.metrics.record_cycle(
            record.rows,
            record.box_width,
            time.perf_counter() - begin,
            record.useful_positions,
            record.computed_positions,
            record.preempted,
        )

    def _publish_blocks(self, result: StepResult) -> None:
        requests = {r.request_id: r for r in result.finished} | self.scheduler.requests
        for request_id, row, block in zip(result.output.request_ids, result.output.rows, result.blocks):
            request = requests.get(request_id)
            if not row.active or request is None:
                continue
            event = BlockEvent(
                index=len(request.generated) // self.decoding.block_length - 1, token_ids=list(block)
            )
            if not self.queue.progress(
                self.worker_id, request_id, event, request.generated, request.prefix_len()
            ):
                logger.warning("lost %s before publishing block %d; dropping it", request_id, event.index)
                self._drop(request_id)

    def _drop(self, request_id: str) -> None:
        """Forget a request another worker now owns: its row, its staged result, its meta."""
        self.scheduler.cancel(request_id)
        self._outbox.pop(request_id, None)
        self._meta.pop(request_id, None)

    def _publish_done(self, request: Request, reason: str, error: str | None = None) -> None:
        self._stage_done(request, reason, error)
        self._flush_outbox()

    def _stage_done(self, request: Request, reason: str, error: str | None = None) -> None:
        generated = request.generated
        done = DoneEvent(
            token_ids=list(generated),
            finish_reason=reason,
            prompt_tokens=request.prompt_len,
            completion_tokens=completion_tokens(generated, self.eos_ids) if generated else 0,
            worker=self.worker_id,
            error=error,
            meta=self._meta.pop(request.request_id, {}),
        )
        self._outbox[request.request_id] = done

    def _flush_outbox(self) -> None:
        """Complete every staged result; one that Redis refuses was completed or taken over elsewhere."""
        for request_id, done in list(self._outbox.items()):
            if self.queue.complete(self.worker_id, request_id, done):
                self.metrics.requests.labels(done.finish_reason).inc()
                self.metrics.generated_tokens.inc(done.completion_tokens)
            else:
                logger.info("%s was completed or taken over elsewhere; dropping our result", request_id)
            del self._outbox[request_id]

    def _hand_back_unfinished(self) -> None:
        """Release what we hold (a draining worker); Redis faults here end the attempt (leases expire)."""
        for request in self._held():
            if request.state in (RequestState.FINISHED, RequestState.CANCELLED):
                continue
            self.queue.release(self.worker_id, request.request_id, request.generated, request.prefix_len())
            self.scheduler.cancel(request.request_id)
            logger.info(
                "handed %s back to the queue with %d tokens", request.request_id, len(request.generated)
            )
