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
import signal
import time
from functools import partial

import redis

from dllm_contracts.heap import freeze_loaded_objects
from dllm_contracts.queue.messages import DoneEvent
from dllm_contracts.queue.ops import BlockCommit, Claimed
from dllm_contracts.queue.resilience import TRANSIENT_ERRORS
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.tracing import Tracing
from engine_pod.engine import Engine, StepResult
from engine_pod.runner.contract import Runner
from engine_pod.scheduler.request import Request, RequestError
from engine_pod.worker.claims import Claims
from engine_pod.worker.config import WorkerConfig
from engine_pod.worker.metrics import WorkerMetrics
from engine_pod.worker.observed import RequestObserver
from engine_pod.worker.prefix_pinning import pin_warm_prefixes
from engine_pod.worker.redis_link import RedisLink
from engine_pod.worker.served import ServedRequest, settings_problem
from engine_pod.worker.wakeups import Wakeups

logger = logging.getLogger(__name__)

RECORD_WINDOW = 1024  # block cycles a long-running worker remembers (bounded memory)


class Worker:
    def __init__(
        self,
        runner: Runner,
        config: WorkerConfig,
        queue: SyncQueue | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.config = config
        self.worker_id = config.resolved_id()
        self.queue = queue or SyncQueue.connect(
            config.redis_url, config.service, config.lease_ms, config.result_ttl_s
        )
        self.decoding = runner.decoding
        self.eos_ids = runner.loaded.config.eos_token_ids
        self.scheduler = config.scheduler_for(runner)
        self.engine = Engine(runner, self.scheduler, record_window=RECORD_WINDOW)
        self.metrics = WorkerMetrics(config.model_name)
        self.metrics.prefix_pinned_tokens.set(pin_warm_prefixes(runner, self.scheduler, config.warm_prefixes))
        self.tracing = tracing or Tracing.off()
        self.observer = RequestObserver(self.metrics, self.tracing, self.worker_id)
        self.metrics.token_budget.set(config.scheduling.token_budget)
        self.draining = False
        self.stopped = False
        self.redis_link = RedisLink(self.worker_id)
        self._drain_deadline: float | None = None
        self._last_renew = 0.0
        self._last_reap = 0.0
        self.claims = Claims(self.queue, self.scheduler, config.scheduling, self.worker_id)
        self.wakeups = Wakeups(
            self.queue.redis.pubsub(ignore_subscribe_messages=True), self.queue.ops.keys.wakeup
        )
        self._served: dict[str, ServedRequest] = {}  # claimed, until its result is staged
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
        if self.draining or self.stopped or not self.redis_link.connected:
            return False
        try:
            return bool(self.queue.redis.ping())
        except redis.RedisError:
            return False

    def run(self) -> None:
        """Serve until drained (SIGTERM) and the work in flight is done or its drain timeout has passed."""
        freeze_loaded_objects()
        try:
            while not self._should_stop():
                self.engine.runner.keep_alive()  # a tensor-parallel group's followers, however idle
                try:
                    self._iterate()
                    self.redis_link.reached()
                except TRANSIENT_ERRORS as exc:
                    self.redis_link.fault(exc, len(self._held()), len(self._outbox))
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
            self.wakeups.pubsub.close()
        self.tracing.shutdown()
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
        self.claims.take(self._admit, self._drop, self._batch_room)

    def _batch_room(self) -> int | None:
        """How many more batch lines this worker may take now (None: no bound but its budget)."""
        cap = self.config.scheduling.batch_max_rows
        if not cap:
            return None
        return max(0, cap - sum(1 for served in self._served.values() if served.in_batch))

    def _admit(self, claimed: Claimed, arrival_time: float | None = None) -> None:
        payload = claimed.request
        held = self.scheduler.requests.get(payload.id)
        if held is not None:  # our lease lapsed during a Redis fault and we claimed it back
            if len(claimed.generated) <= len(held.generated):
                return  # the copy we hold is as far along: keep it
            self.scheduler.cancel(payload.id)
        request = self.scheduler.request_for(payload.id, payload.prompt_ids, payload.params, arrival_time)
        self.observer.claimed(claimed)
        served = self._served[payload.id] = ServedRequest.claimed(
            claimed, request, self.config.model_identity, partial(settings_problem, self.engine.runner)
        )
        request.in_batch = served.in_batch
        if served.error is None:
            request.finish_reason = self.scheduler.finish_reason_for(request)
        if request.finish_reason is not None:  # refused, or its last block was stored and its result not
            return self._publish_done(request)
        try:
            self.scheduler.add(request)
        except RequestError as exc:
            logger.warning("rejecting %s: %s", payload.id, exc)
            served.refuse(str(exc))
            self._publish_done(request)

    def _wait_for_work(self) -> None:
        self.wakeups.wait(self.config.idle_wait_s, self.config.scheduling.batch_window_s)

    def _step(self) -> None:
        begin, begin_ns = time.perf_counter(), time.time_ns()
        result = self.engine.step()
        if result.output.is_empty:
            return
        blocks = self._committed_blocks(result)
        self._unsent += blocks
        record = self.engine.records[-1]
        self.observer.cycle(blocks, begin_ns, time.time_ns(), record.rows)
        for request in result.finished:
            self._stage_done(request)
        self._commit()
        self.metrics.record_cycle(record, time.perf_counter() - begin)
        self.metrics.record_logits(result.stats.logits_materialized, result.stats.peak_logits)
        cache = self.engine.runner.prefix_cache_stats
        if cache is not None:
            self.metrics.record_prefix_cache(cache, result.stats.cached_on_entry)

    def _committed_blocks(self, result: StepResult) -> list[BlockCommit]:
        """What this cycle committed, per active row: its progress, its block event for a streaming client
        and, for a request that asked, the block's log probabilities (kept for the result and in Redis
        for a worker that takes the request over)."""
        per_row = result.logprobs or [None] * len(result.blocks)
        blocks = []
        for request_id, row, block, values in zip(
            result.output.request_ids, result.output.rows, result.blocks, per_row
        ):
            served = self._served.get(request_id)
            if row.active and block is not None and served is not None:
                blocks.append(served.commit(list(block), values, self.decoding.block_length))
        return blocks

    def _commit(self) -> None:
        """Everything Redis has not acknowledged, in one round trip: blocks (in order), results, and the
        question which held requests were cancelled. On a fault it all stays here for the next try."""
        results, sent = list(self._outbox.items()), self._unsent
        reply = self.queue.commit(self.worker_id, sent, results, [r.request_id for r in self._held()])
        self._unsent = []
        self.observer.recorded(sent, reply.lost)
        for request_id in reply.lost:
            logger.warning("lost %s before publishing its block; dropping it", request_id)
            self._drop(request_id)
        for request_id, done in results:
            if reply.completed.get(request_id):
                self.metrics.requests.labels(done.finish_reason).inc()
                self.metrics.generated_tokens.inc(done.completion_tokens)
                self.observer.finished(request_id, done)
            else:
                logger.info("%s was completed or taken over elsewhere; dropping our result", request_id)
                self.observer.forget(request_id)
            self._outbox.pop(request_id, None)
        for request_id in reply.cancelled:
            request = self.scheduler.cancel(request_id)
            if request is not None:
                self._stage_done(request)  # cancelled: sent with the next cycle's exchange

    def _drop(self, request_id: str) -> None:
        """Forget a request another worker now owns: its row, its record, its staged result."""
        self.scheduler.cancel(request_id)
        self._outbox.pop(request_id, None)
        self._served.pop(request_id, None)
        self.observer.forget(request_id)

    def _publish_done(self, request: Request) -> None:
        self._stage_done(request)
        self._commit()

    def _stage_done(self, request: Request) -> None:
        """Stage ``request``'s result (its status is its finish reason) for the next exchange with Redis."""
        served = self._served.pop(request.request_id, None) or ServedRequest(request, {})
        done = served.done(self.worker_id, self.eos_ids, self.decoding.ignore_eos)
        self._outbox[request.request_id] = done

    def _hand_back_unfinished(self) -> None:
        """Release what we hold (a draining worker; the scheduler holds no finished or cancelled request);
        Redis faults here end the attempt (leases expire)."""
        for request in self._held():
            self.queue.release(self.worker_id, request.request_id, request.generated, request.prefix_len())
            self.scheduler.cancel(request.request_id)
            self.observer.forget(request.request_id)
            logger.info(
                "handed %s back to the queue with %d tokens", request.request_id, len(request.generated)
            )
