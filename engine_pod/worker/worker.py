"""The engine worker: BlockServe admission drawing from Redis, results published per request.

Each loop iteration: reap expired leases, renew ours, honour cancellations, claim what fits the
token budget (sand filling through the claim script), run one block cycle, then publish every
committed block and complete finished requests exactly once. SIGTERM stops claiming; in-flight
work finishes within the drain timeout or goes back to the queue with its committed blocks.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import dataclass

import redis

from engine_pod.engine import Engine, StepResult
from engine_pod.queue.messages import BlockEvent, DoneEvent
from engine_pod.queue.ops import Claimed
from engine_pod.queue.sync_client import SyncQueue
from engine_pod.runner.block_cycle import BlockCycleRunner
from engine_pod.scheduler.blockserve import DEFAULT_MIN_PADDING_EFFICIENCY, BlockServeScheduler
from engine_pod.scheduler.request import Request, RequestError, RequestState
from engine_pod.text import completion_tokens
from engine_pod.worker.metrics import WorkerMetrics

logger = logging.getLogger(__name__)


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

    def resolved_id(self) -> str:
        return self.worker_id or f"{socket.gethostname()}-{os.getpid()}"


class Worker:
    def __init__(
        self, runner: BlockCycleRunner, config: WorkerConfig, queue: SyncQueue | None = None
    ) -> None:
        self.config = config
        self.worker_id = config.resolved_id()
        self.queue = queue or SyncQueue.connect(config.redis_url, config.service, config.lease_ms)
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
        self.engine = Engine(runner, self.scheduler)
        self.metrics = WorkerMetrics()
        self.metrics.token_budget.set(config.token_budget)
        self.draining = False
        self.stopped = False
        self._last_renew = 0.0
        self._last_reap = 0.0
        self._pubsub = None
        self._meta: dict[str, dict] = {}  # request id -> payload meta, echoed in its done event

    # -- lifecycle ----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.drain())
        signal.signal(signal.SIGINT, lambda *_: self.drain())

    def drain(self) -> None:
        if not self.draining:
            logger.info("worker %s draining: no new claims", self.worker_id)
        self.draining = True

    def ready(self) -> bool:
        if self.draining or self.stopped:
            return False
        try:
            return bool(self.queue.redis.ping())
        except redis.RedisError:
            return False

    def run(self, max_idle_s: float | None = None) -> None:
        """Serve until drained (SIGTERM) or, with ``max_idle_s``, until idle that long."""
        self._pubsub = self.queue.redis.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(self.queue.ops.keys.wakeup)
        idle_since = time.monotonic()
        drain_deadline = None
        try:
            while True:
                self._housekeeping()
                if not self.draining:
                    self._claim()
                elif drain_deadline is None:
                    drain_deadline = time.monotonic() + self.config.drain_timeout_s
                if self.engine.has_work():
                    self._step()
                    idle_since = time.monotonic()
                elif self.draining or (max_idle_s is not None and time.monotonic() - idle_since > max_idle_s):
                    break
                else:
                    self._wait_for_work()
                if drain_deadline is not None and time.monotonic() > drain_deadline:
                    break
        finally:
            self._hand_back_unfinished()
            self._pubsub.close()
            self.stopped = True
            logger.info("worker %s stopped", self.worker_id)

    # -- the loop's parts ---------------------------------------------------------------------
    def _held(self) -> list[Request]:
        return list(self.scheduler.requests.values())

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_reap > self.config.lease_ms / 3000:
            self.queue.reap()
            self._last_reap = now
            pending, inflight = self.queue.depth()
            self.metrics.queue_depth.labels("pending").set(pending)
            self.metrics.queue_depth.labels("inflight").set(inflight)
        if now - self._last_renew > self.config.lease_ms / 3000:
            for request_id in self.queue.renew(self.worker_id, [r.request_id for r in self._held()]):
                logger.warning("lost the lease of %s; dropping it", request_id)
                self.scheduler.cancel(request_id)
            self._last_renew = now
        for request_id in self.queue.cancelled_among([r.request_id for r in self._held()]):
            request = self.scheduler.cancel(request_id)
            if request is not None:
                self._publish_done(request, "cancelled")

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
        request = Request.from_tokens(
            payload.id, payload.prompt_ids, payload.max_tokens, self.decoding.block_length
        )
        request.generated = list(claimed.generated)
        request.threshold = payload.threshold
        self._meta[payload.id] = payload.meta
        try:
            self.scheduler.add(request)
        except RequestError as exc:
            logger.warning("rejecting %s: %s", payload.id, exc)
            self._publish_done(request, "error", str(exc))

    def _wait_for_work(self) -> None:
        self._pubsub.get_message(timeout=self.config.idle_wait_s)

    def _step(self) -> None:
        begin = time.perf_counter()
        result = self.engine.step()
        if result.output.is_empty:
            return
        self._publish_blocks(result)
        for request in result.finished:
            self._publish_done(request, request.finish_reason.value if request.finish_reason else "length")
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
                self.scheduler.cancel(request_id)

    def _publish_done(self, request: Request, reason: str, error: str | None = None) -> None:
        generated = request.generated
        used = completion_tokens(generated, self.eos_ids) if generated else 0
        done = DoneEvent(
            token_ids=list(generated),
            finish_reason=reason,
            prompt_tokens=request.prompt_len,
            completion_tokens=used,
            worker=self.worker_id,
            error=error,
            meta=self._meta.pop(request.request_id, {}),
        )
        if self.queue.complete(self.worker_id, request.request_id, done):
            self.metrics.requests.labels(reason).inc()
            self.metrics.generated_tokens.inc(used)

    def _hand_back_unfinished(self) -> None:
        for request in self._held():
            if request.state in (RequestState.FINISHED, RequestState.CANCELLED):
                continue
            self.queue.release(self.worker_id, request.request_id, request.generated, request.prefix_len())
            self.scheduler.cancel(request.request_id)
            logger.info(
                "handed %s back to the queue with %d tokens", request.request_id, len(request.generated)
            )
