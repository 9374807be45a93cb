"""Queue operations as plain (script, keys, args) calls, executed by the sync or the asyncio client.

Building the calls once keeps the worker (sync) and the gateway (asyncio) speaking exactly the same
protocol.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from dllm_contracts.queue import batch_scripts, file_scripts, limit_scripts, request_scripts, scripts
from dllm_contracts.queue.keys import RESULT_TTL_S, ServiceKeys
from dllm_contracts.queue.messages import BlockEvent, DoneEvent, QueuedRequest, encode_event

DEFAULT_LEASE_MS = 30_000
ANY_WAIT = -1.0  # a candidates read's wait bound that every pending request passes: the oldest first


@dataclass(frozen=True)
class ScriptCall:
    script: str  # name of a script in dllm_contracts.queue (scripts, request_scripts, batch_scripts)
    keys: list[str]
    args: list[str | int | float]


@dataclass
class Claimed:
    request: QueuedRequest
    generated: list[int]  # blocks committed by earlier workers
    logprobs: list = field(default_factory=list)  # their tokens' log probabilities, where recorded
    unknown_fields: list[str] = field(default_factory=list)  # in its payload, unknown to this version
    queued_s: float | None = None  # its wait since first enqueued (Redis's clock, when read); None: unknown
    invalid_settings: str | None = None  # why its payload's settings are invalid (None: they are valid)


@dataclass(frozen=True)
class Candidate:
    """A pending request as a worker sees it before claiming: enough to decide whether it is admissible."""

    id: str
    prefix: int  # prompt plus committed tokens: its score in the pending set
    prompt_tokens: int
    max_tokens: int
    waited_s: float  # since it was first enqueued (Redis's clock); 0 for a batch line
    batch: bool = False  # a line of a batch (the batch lane)
    queued_s: float = 0.0  # since it was first enqueued (Redis's clock), whatever its lane: what it waited


@dataclass(frozen=True)
class ClaimCandidates:
    """What a worker may claim next, as the CANDIDATES script lists the pending set."""

    shortest: list[Candidate]  # the shortest pending, up to the prefix asked for
    aged: list[Candidate]  # those that waited past the bound, longest first


@dataclass(frozen=True)
class BlockCommit:
    """One committed block of one request, as the worker records it."""

    request_id: str
    event: BlockEvent | None  # None: a request that does not stream (its client waits for the result)
    generated: list[int]  # every token committed so far
    score: int  # its prefix, should it go back to the pending set
    index: int = 0  # the block's number within the generation
    logprobs: list | None = None  # per token of the block, for a request that asked (kept for a hand-over)


@dataclass(frozen=True)
class IngestChunk:
    """One chunk of a batch's input lines, as the gateway holding the batch queues it."""

    gateway: str  # the gateway holding the batch's lease
    start: int  # the batch's cursor before the chunk (lines of the input file already taken in)
    end: int  # its cursor after the chunk
    requests: list[QueuedRequest]  # the chunk's lines that run
    errors: list[tuple[str, str]]  # the chunk's lines that cannot run: (results field, error line json)


@dataclass(frozen=True)
class CommitReply:
    lost: set[str]  # requests whose block was refused: another worker owns them now
    completed: dict[str, bool]  # per result: False when completed or taken over elsewhere
    cancelled: set[str]  # held requests whose clients cancelled them


def text_of(value):
    """One Redis reply value as str (bytes decoded; clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else value


def as_text(values: list) -> list:
    """A Redis reply's items as str."""
    return [text_of(value) for value in values]


def now_ms() -> int:
    return int(time.time() * 1000)


class QueueOps:
    def __init__(
        self, service: str, lease_ms: int = DEFAULT_LEASE_MS, result_ttl_s: int = RESULT_TTL_S
    ) -> None:
        self.keys = ServiceKeys(service)
        self.lease_ms = lease_ms
        self.result_ttl_s = result_ttl_s

    def enqueue(self, request: QueuedRequest, max_queued: int = 0, head_start_ms: int = 0) -> ScriptCall:
        return self.enqueue_all([request], max_queued, head_start_ms)

    def enqueue_all(
        self, requests: list[QueuedRequest], max_queued: int = 0, head_start_ms: int = 0
    ) -> ScriptCall:
        """Every request or none; scored by prompt length. One call enqueues members of one batch at most.
        ``head_start_ms``: their priority's, dating their arrival earlier (later, when negative)."""
        batches = {r.batch_id for r in requests}
        if len(batches) > 1:
            raise ValueError(f"one enqueue takes requests of one batch, got {sorted(batches)}")
        k, batch_id = self.keys, batches.pop() if batches else ""
        pending, arrivals = k.lane(batch_id)
        keys = [pending, k.live, k.wakeup, arrivals, k.sizes, k.inflight, k.pending]
        args: list = [max_queued, batch_id, int(head_start_ms), *_request_args(requests)]
        return ScriptCall("ENQUEUE", [*keys, *(k.request(r.id) for r in requests)], args)

    def ingest(self, batch_id: str, chunk: IngestChunk, ttl_s: int) -> ScriptCall:
        """One chunk of a batch's input: its lines queued in the batch lane, its error lines recorded, the
        batch's cursor moved on, only if ``chunk.gateway`` holds the batch and the cursor is at
        ``chunk.start`` (see ``batch_scripts.INGEST``)."""
        k = self.keys
        pending, arrivals = k.lane(batch_id)
        keys = [pending, k.live, k.wakeup, arrivals, k.sizes]
        keys += [k.batch(batch_id), k.batch_results(batch_id), k.batch_members(batch_id)]
        args: list = [chunk.gateway, chunk.start, chunk.end, ttl_s, len(chunk.requests), len(chunk.errors)]
        args += _request_args(chunk.requests)
        for field_name, line in chunk.errors:
            args += [field_name, line]
        return ScriptCall("INGEST", [*keys, *(k.request(r.id) for r in chunk.requests)], args)

    def batch_lease(self, batch_id: str, gateway: str, lease_ms: int, renew: bool) -> ScriptCall:
        """Take (``renew=False``: only if no live gateway holds it) or renew a batch's lease."""
        keys = [self.keys.batch_leases, self.keys.batch(batch_id)]
        return ScriptCall("BATCH_LEASE", keys, [gateway, lease_ms, "1" if renew else "0"])

    def candidates(
        self,
        max_prefix: int,
        count: int,
        max_wait_s: float,
        aged_count: int,
        batch_wait_s: float = 0.0,
        batch_room: int | None = None,
    ) -> ScriptCall:
        """Read what may be claimed: the ``count`` shortest pending with a prefix of at most
        ``max_prefix`` (interactive first, then up to ``batch_room`` batch lines: default ``count``), and up
        to ``aged_count`` that waited more than ``max_wait_s`` (0: none; ``ANY_WAIT``: the oldest pending,
        whatever their wait), then batch lines that waited more than ``batch_wait_s`` (0: none)."""
        k = self.keys
        keys = [k.pending, k.arrivals, k.sizes, k.batch_pending, k.batch_arrivals]
        room = max(count, aged_count) if batch_room is None else batch_room
        args = [max_prefix, count, int(max_wait_s * 1000), aged_count, int(batch_wait_s * 1000), room]
        return ScriptCall("CANDIDATES", keys, args)

    @staticmethod
    def parse_candidates(reply: list) -> ClaimCandidates:
        now, shortest, aged = reply[0], as_text(reply[1]), as_text(reply[2])
        return ClaimCandidates(_candidates(shortest, int(now)), _candidates(aged, int(now)))

    def claim(self, worker: str, chosen: list[tuple[str, int]]) -> ScriptCall:
        """Claim each of ``chosen`` (id, prefix it was read with) that is still pending with that prefix."""
        deadline = now_ms() + self.lease_ms
        k = self.keys
        keys = [k.pending, k.inflight, k.arrivals, k.batch_pending, k.batch_arrivals]
        keys += [k.request(request_id) for request_id, _ in chosen]
        args: list = [deadline, worker]
        for request_id, prefix in chosen:
            args += [request_id, prefix]
        return ScriptCall("CLAIM", keys, args)

    @staticmethod
    def parse_claim(reply: list) -> list[Claimed]:
        items = as_text(reply)
        claimed = []
        for i in range(0, len(items), 4):
            request, unknown, invalid = QueuedRequest.read(items[i + 1])
            generated = json.loads(items[i + 2] or "[]")
            logprobs = [entry for block in json.loads(items[i + 3] or "[]") for entry in block]
            claimed.append(Claimed(request, generated, logprobs, unknown, invalid_settings=invalid))
        return claimed

    def renew(self, worker: str, request_ids: list[str]) -> ScriptCall:
        return ScriptCall(
            "RENEW",
            [self.keys.inflight, *map(self.keys.request, request_ids)],
            [now_ms() + self.lease_ms, worker, *request_ids],
        )

    def reap(self, candidates: list[str], now: int) -> ScriptCall:
        """Return to pending those of ``candidates`` (in-flight ids read as expired) still expired at ``now``."""
        k = self.keys
        keys = [k.inflight, k.wakeup, k.pending, k.batch_pending, k.arrivals, k.batch_arrivals]
        keys += [k.request(request_id) for request_id in candidates]
        return ScriptCall("REAP", keys, [now, *candidates])

    def _batch_keys(self, batch_id: str) -> list[str]:
        return [self.keys.batch(batch_id), self.keys.batch_results(batch_id)] if batch_id else []

    def commit(
        self, worker: str, blocks: list[BlockCommit], results: list[tuple[str, DoneEvent]], held: list[str]
    ) -> ScriptCall:
        """A block cycle's exchange in one call: its committed blocks, its finished requests' results
        (batch keys from each result's meta, the request's, passed through by the worker), and which of
        the ``held`` requests were cancelled."""
        k = self.keys
        keys = [k.inflight, k.cancelled, k.live, k.sizes]
        args: list = [worker, self.result_ttl_s, len(blocks), len(results)]
        for block in blocks:
            keys += [k.request(block.request_id), k.events(block.request_id)]
            event = encode_event(block.event) if block.event is not None else ""
            logprobs = "" if block.logprobs is None else json.dumps(block.logprobs, separators=(",", ":"))
            args += [event, json.dumps(block.generated), block.score, block.index, logprobs]
        for request_id, done in results:
            own = [k.request(request_id), k.events(request_id), *self._batch_keys(done.batch_id)]
            keys += own
            args += [encode_event(done), len(own)]
        return ScriptCall("COMMIT", keys, [*args, *held])

    @staticmethod
    def parse_commit(reply: list, results: list[tuple[str, DoneEvent]]) -> CommitReply:
        lost, completed, cancelled = reply
        return CommitReply(
            set(as_text(lost)),
            {request_id: bool(flag) for (request_id, _), flag in zip(results, completed)},
            set(as_text(cancelled)),
        )

    def release(self, worker: str, request_id: str, generated: list[int], score: int) -> ScriptCall:
        k = self.keys
        keys = [k.inflight, k.request(request_id), k.wakeup, k.pending, k.batch_pending]
        keys += [k.arrivals, k.batch_arrivals]
        return ScriptCall("RELEASE", keys, [worker, json.dumps(generated), score])

    def cancel(
        self, request_id: str, prompt_tokens: int, batch_id: str = "", expire: bool = False
    ) -> ScriptCall:
        """Cancel a request (its done event keeps the request's meta). ``expire``: end it only if it has
        not started (a batch line past its completion window), with finish reason ``expired``."""
        reason = "expired" if expire else "cancelled"
        done = DoneEvent(token_ids=[], finish_reason=reason, prompt_tokens=prompt_tokens, completion_tokens=0)
        k = self.keys
        pending, arrivals = k.lane(batch_id)
        keys = [pending, k.request(request_id), k.events(request_id), k.cancelled, k.live, arrivals, k.sizes]
        keys += self._batch_keys(batch_id)
        return ScriptCall("CANCEL", keys, [encode_event(done), self.result_ttl_s, "1" if expire else "0"])

    def batch_status(self, batch_id: str, to: str, since: tuple[str, ...], stamp: str = "") -> ScriptCall:
        """Move a batch to ``to`` if it is in one of ``since`` (setting ``stamp`` to now if it has none)."""
        return ScriptCall("BATCH_STATUS", [self.keys.batch(batch_id)], [to, stamp, int(time.time()), *since])


def script_sources() -> dict[str, str]:
    by_module = {
        scripts: ("CANDIDATES", "CLAIM", "RENEW", "REAP", "COMMIT", "RELEASE"),
        request_scripts: ("CANCEL", "ENQUEUE"),
        batch_scripts: ("INGEST", "BATCH_LEASE", "BATCH_STATUS"),
        limit_scripts: ("LIMIT_ADMIT", "LIMIT_RELEASE", "BATCH_LINES_ADMIT"),
        file_scripts: file_scripts.SCRIPTS,
    }
    return {name: getattr(module, name) for module, names in by_module.items() for name in names}


def _request_args(requests: list[QueuedRequest]) -> list:
    """ENQUEUE's and INGEST's arguments per request: its score (prompt length), max tokens and payload."""
    args: list = []
    for request in requests:
        args += [len(request.prompt_ids), request.max_tokens, request.to_json()]
    return args


def _candidates(flat: list[str], now: int) -> list[Candidate]:
    """Candidates from CANDIDATES' flat (id, prefix, sizes, lane) quadruples. A request enqueued without
    sizes (by a gateway older than them) is read as its prefix alone, not yet waiting. A batch line is read
    as not waiting: it fills the room interactive requests leave and never takes their turn (its aging is
    the queue's: it is offered among the aged once it waited past the batch bound)."""
    out = []
    for i in range(0, len(flat), 4):
        request_id, prefix = flat[i], int(float(flat[i + 1] or 0))
        prompt, tokens, enqueued, *head_start = (flat[i + 2] or f"{prefix} 1 {now}").split()
        waited_ms = now - int(enqueued)  # since its arrival as its priority dates it: the queue's order
        queued_s = max(0, waited_ms - int(head_start[0] if head_start else 0)) / 1000  # what it really waited
        waited_s = 0.0 if flat[i + 3] else max(0, waited_ms) / 1000
        out.append(
            Candidate(request_id, prefix, int(prompt), int(tokens), waited_s, bool(flat[i + 3]), queued_s)
        )
    return out
