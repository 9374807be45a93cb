"""Queue operations as plain (script, keys, args) calls, executed by the sync or the asyncio client.

Building the calls once keeps the worker (sync) and the gateway (asyncio) speaking exactly the same
protocol.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from engine_pod.queue import scripts
from engine_pod.queue.keys import ServiceKeys
from engine_pod.queue.messages import BlockEvent, DoneEvent, QueuedRequest, encode_event

RESULT_TTL_S = 3600
DEFAULT_LEASE_MS = 30_000


@dataclass(frozen=True)
class ScriptCall:
    script: str  # name of a script in engine_pod.queue.scripts
    keys: list[str]
    args: list[str | int | float]


@dataclass
class Claimed:
    request: QueuedRequest
    generated: list[int]  # blocks committed by earlier workers


def as_text(values: list) -> list:
    """A Redis reply's items as str (bytes decoded; clients may or may not decode responses)."""
    return [value.decode() if isinstance(value, bytes) else value for value in values]


def now_ms() -> int:
    return int(time.time() * 1000)


class QueueOps:
    def __init__(
        self, service: str, lease_ms: int = DEFAULT_LEASE_MS, result_ttl_s: int = RESULT_TTL_S
    ) -> None:
        self.keys = ServiceKeys(service)
        self.lease_ms = lease_ms
        self.result_ttl_s = result_ttl_s

    def enqueue(self, request: QueuedRequest, max_queued: int = 0) -> ScriptCall:
        return self.enqueue_all([request], max_queued)

    def enqueue_all(self, requests: list[QueuedRequest], max_queued: int = 0) -> ScriptCall:
        """Every request or none; scored by prompt length. One call enqueues members of one batch at most."""
        batches = {r.batch_id for r in requests}
        if len(batches) > 1:
            raise ValueError(f"one enqueue takes requests of one batch, got {sorted(batches)}")
        keys = [self.keys.pending, self.keys.live, self.keys.wakeup]
        keys += [self.keys.request(r.id) for r in requests]
        args: list = [max_queued, batches.pop() if batches else ""]
        for request in requests:
            args += [len(request.prompt_ids), request.to_json()]
        return ScriptCall("ENQUEUE", keys, args)

    def claim(self, worker: str, max_prefix: int, count: int, candidates: list[str]) -> ScriptCall:
        """Claim up to ``count`` of ``candidates`` (pending ids, shortest first, read just before) that
        are still pending with a prefix of at most ``max_prefix``."""
        deadline = now_ms() + self.lease_ms
        keys = [self.keys.pending, self.keys.inflight, *map(self.keys.request, candidates)]
        return ScriptCall("CLAIM", keys, [max_prefix, count, deadline, worker, *candidates])

    @staticmethod
    def parse_claim(reply: list) -> list[Claimed]:
        items = as_text(reply)
        return [
            Claimed(QueuedRequest.from_json(items[i + 1]), json.loads(items[i + 2] or "[]"))
            for i in range(0, len(items), 3)
        ]

    def renew(self, worker: str, request_ids: list[str]) -> ScriptCall:
        return ScriptCall(
            "RENEW",
            [self.keys.inflight, *map(self.keys.request, request_ids)],
            [now_ms() + self.lease_ms, worker, *request_ids],
        )

    def reap(self, candidates: list[str], now: int) -> ScriptCall:
        """Return to pending those of ``candidates`` (in-flight ids read as expired) still expired at ``now``."""
        keys = [self.keys.inflight, self.keys.pending, self.keys.wakeup, *map(self.keys.request, candidates)]
        return ScriptCall("REAP", keys, [now, *candidates])

    def _batch_keys(self, batch_id: str) -> list[str]:
        return [self.keys.batch(batch_id), self.keys.batch_results(batch_id)] if batch_id else []

    def progress(
        self, worker: str, request_id: str, event: BlockEvent, generated: list[int], score: int
    ) -> ScriptCall:
        keys = [self.keys.inflight, self.keys.request(request_id), self.keys.events(request_id)]
        return ScriptCall("PROGRESS", keys, [worker, encode_event(event), json.dumps(generated), score])

    def complete(self, worker: str, request_id: str, done: DoneEvent) -> ScriptCall:
        """Batch keys come from ``done``'s meta (the request's, passed through by the worker)."""
        keys = [
            self.keys.inflight,
            self.keys.request(request_id),
            self.keys.events(request_id),
            self.keys.cancelled,
            self.keys.live,
            *self._batch_keys(done.batch_id),
        ]
        return ScriptCall("COMPLETE", keys, [worker, encode_event(done), self.result_ttl_s])

    def release(self, worker: str, request_id: str, generated: list[int], score: int) -> ScriptCall:
        keys = [self.keys.inflight, self.keys.pending, self.keys.request(request_id), self.keys.wakeup]
        return ScriptCall("RELEASE", keys, [worker, json.dumps(generated), score])

    def cancel(self, request_id: str, prompt_tokens: int, batch_id: str = "") -> ScriptCall:
        done = DoneEvent(
            token_ids=[], finish_reason="cancelled", prompt_tokens=prompt_tokens, completion_tokens=0
        )
        keys = [
            self.keys.pending,
            self.keys.request(request_id),
            self.keys.events(request_id),
            self.keys.cancelled,
            self.keys.live,
            *self._batch_keys(batch_id),
        ]
        return ScriptCall("CANCEL", keys, [encode_event(done), self.result_ttl_s])


def script_sources() -> dict[str, str]:
    return {
        name: getattr(scripts, name)
        for name in ("CLAIM", "RENEW", "REAP", "PROGRESS", "COMPLETE", "RELEASE", "CANCEL", "ENQUEUE")
    }
