"""The worker's (synchronous) view of the queue."""

from __future__ import annotations

import redis

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.messages import EVENT_FIELD, BlockEvent, DoneEvent, decode_event
from dllm_contracts.queue.ops import (
    RESULT_TTL_S,
    BlockCommit,
    ClaimCandidates,
    Claimed,
    CommitReply,
    QueueOps,
    ScriptCall,
    as_text,
    now_ms,
    script_sources,
)
from dllm_contracts.queue.resilience import CLIENT_OPTIONS

CLAIM_ROUNDS = 4  # reads of candidates per claim, when other workers took some of the ones read
REAP_BATCH = 256  # expired leases returned per reap call (the next call takes the rest)


class SyncQueue:
    def __init__(self, client: redis.Redis, ops: QueueOps) -> None:
        self.redis = client
        self.ops = ops
        self._scripts = {name: client.register_script(source) for name, source in script_sources().items()}

    @classmethod
    def connect(cls, url: str, service: str, lease_ms: int, result_ttl_s: int = RESULT_TTL_S) -> SyncQueue:
        ops = QueueOps(service, lease_ms=lease_ms, result_ttl_s=result_ttl_s)
        return cls(sync_client(url, **CLIENT_OPTIONS), ops)

    def run(self, call: ScriptCall):
        return self._scripts[call.script](keys=call.keys, args=call.args)

    def run_all(self, calls: list[ScriptCall]) -> list:
        """Several calls in one round trip, each its own script run, in order (not one transaction)."""
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            self._scripts[call.script](keys=call.keys, args=call.args, client=pipe)
        return pipe.execute()

    def candidates(
        self,
        max_prefix: int,
        count: int,
        max_wait_s: float = 0.0,
        aged_count: int = 0,
        batch_wait_s: float = 0.0,
        batch_room: int | None = None,
    ) -> ClaimCandidates:
        """What may be claimed (see ``QueueOps.candidates``: interactive first, batch lines after)."""
        call = self.ops.candidates(max_prefix, count, max_wait_s, aged_count, batch_wait_s, batch_room)
        return QueueOps.parse_candidates(self.run(call))

    def claim_chosen(self, worker: str, chosen: list[tuple[str, int]]) -> list[Claimed]:
        """Claim each (id, prefix read) of ``chosen`` still pending with that prefix; skips the others."""
        return QueueOps.parse_claim(self.run(self.ops.claim(worker, chosen))) if chosen else []

    def claim(self, worker: str, max_prefix: int, count: int) -> list[Claimed]:
        """Up to ``count`` of the shortest pending requests with a prefix of at most ``max_prefix``, with no
        admission decision (the worker decides through its scheduler; this is for tools and tests).

        When another worker took some of those read, reads again (a few rounds)."""
        claimed: list[Claimed] = []
        for _ in range(CLAIM_ROUNDS):
            shortest = self.candidates(max_prefix, count - len(claimed)).shortest
            got = self.claim_chosen(worker, [(c.id, c.prefix) for c in shortest])
            claimed += got
            if not shortest or len(got) == len(shortest):  # nobody raced us: what was there, we have
                break
        return claimed

    def renew(self, worker: str, request_ids: list[str]) -> set[str]:
        if not request_ids:
            return set()
        return set(as_text(self.run(self.ops.renew(worker, request_ids))))

    def reap(self) -> int:
        """Return expired leases to pending (up to ``REAP_BATCH`` per call); how many were returned."""
        now = now_ms()
        expired = as_text(self.redis.zrangebyscore(self.ops.keys.inflight, "-inf", now, 0, REAP_BATCH))
        return int(self.run(self.ops.reap(expired, now))) if expired else 0

    def commit(
        self,
        worker: str,
        blocks: list[BlockCommit],
        results: list[tuple[str, DoneEvent]],
        held: list[str] = (),
    ) -> CommitReply:
        """One block cycle's exchange with Redis, in one round trip (see ``scripts.COMMIT``)."""
        if not blocks and not results and not held:
            return CommitReply(set(), {}, set())
        reply = self.run(self.ops.commit(worker, blocks, results, list(held)))
        return QueueOps.parse_commit(reply, results)

    def progress(
        self, worker: str, request_id: str, event: BlockEvent, generated: list[int], score: int
    ) -> bool:
        """Record one committed block; False when this worker no longer owns the request."""
        reply = self.commit(worker, [BlockCommit(request_id, event, generated, score, event.index)], [])
        return request_id not in reply.lost

    def complete(self, worker: str, request_id: str, done: DoneEvent) -> bool:
        """Complete one request; False when it was completed or taken over elsewhere."""
        return self.commit(worker, [], [(request_id, done)]).completed[request_id]

    def release(self, worker: str, request_id: str, generated: list[int], score: int) -> bool:
        return bool(self.run(self.ops.release(worker, request_id, generated, score)))

    def events_of(self, request_id: str) -> list[BlockEvent | DoneEvent]:
        """Every event still stored for a request, oldest first."""
        entries = self.redis.xrange(self.ops.keys.events(request_id))
        return [decode_event(fields[EVENT_FIELD.encode()]) for _, fields in entries]

    def depth(self) -> tuple[int, int]:
        """Pending (both lanes) and in flight."""
        pipe = self.redis.pipeline()
        for key in (self.ops.keys.pending, self.ops.keys.batch_pending, self.ops.keys.inflight):
            pipe.zcard(key)
        pending, batch_pending, inflight = pipe.execute()
        return int(pending) + int(batch_pending), int(inflight)
