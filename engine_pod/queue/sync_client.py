"""The worker's (synchronous) view of the queue."""

from __future__ import annotations

import redis

from engine_pod.queue.messages import EVENT_FIELD, BlockEvent, DoneEvent, decode_event
from engine_pod.queue.ops import RESULT_TTL_S, Claimed, QueueOps, ScriptCall, script_sources
from engine_pod.queue.resilience import CLIENT_OPTIONS


class SyncQueue:
    def __init__(self, client: redis.Redis, ops: QueueOps) -> None:
        self.redis = client
        self.ops = ops
        self._scripts = {name: client.register_script(source) for name, source in script_sources().items()}

    @classmethod
    def connect(cls, url: str, service: str, lease_ms: int, result_ttl_s: int = RESULT_TTL_S) -> SyncQueue:
        ops = QueueOps(service, lease_ms=lease_ms, result_ttl_s=result_ttl_s)
        return cls(redis.Redis.from_url(url, **CLIENT_OPTIONS), ops)

    def run(self, call: ScriptCall):
        return self._scripts[call.script](keys=call.keys, args=call.args)

    def claim(self, worker: str, max_prefix: int, count: int) -> list[Claimed]:
        return QueueOps.parse_claim(self.run(self.ops.claim(worker, max_prefix, count)))

    def renew(self, worker: str, request_ids: list[str]) -> set[str]:
        if not request_ids:
            return set()
        return {i.decode() for i in self.run(self.ops.renew(worker, request_ids))}

    def reap(self) -> int:
        return int(self.run(self.ops.reap()))

    def progress(
        self, worker: str, request_id: str, event: BlockEvent, generated: list[int], score: int
    ) -> bool:
        return bool(self.run(self.ops.progress(worker, request_id, event, generated, score)))

    def complete(self, worker: str, request_id: str, done: DoneEvent) -> bool:
        return bool(self.run(self.ops.complete(worker, request_id, done)))

    def release(self, worker: str, request_id: str, generated: list[int], score: int) -> bool:
        return bool(self.run(self.ops.release(worker, request_id, generated, score)))

    def cancelled_among(self, request_ids: list[str]) -> set[str]:
        if not request_ids:
            return set()
        flags = self.redis.smismember(self.ops.keys.cancelled, request_ids)
        return {rid for rid, flag in zip(request_ids, flags) if flag}

    def events_of(self, request_id: str) -> list[BlockEvent | DoneEvent]:
        """Every event still stored for a request, oldest first."""
        entries = self.redis.xrange(self.ops.keys.events(request_id))
        return [decode_event(fields[EVENT_FIELD.encode()]) for _, fields in entries]

    def depth(self) -> tuple[int, int]:
        pipe = self.redis.pipeline()
        pipe.zcard(self.ops.keys.pending)
        pipe.zcard(self.ops.keys.inflight)
        pending, inflight = pipe.execute()
        return int(pending), int(inflight)

    def min_pending_score(self) -> int | None:
        first = self.redis.zrange(self.ops.keys.pending, 0, 0, withscores=True)
        return int(first[0][1]) if first else None
