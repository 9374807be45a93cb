"""Redis key names of one service's queue. Every key of a service starts with ``dllm:{<service>}:``: the
braces make the service name the hash tag, so on a Redis Cluster all of one service's keys live in one
slot and every queue script (which names each key it touches in KEYS) runs on one node."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

RESULT_TTL_S = 3600  # how long a finished request's record and result stay (here: no orjson, for the CLI)
_SERVICE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


_ID = re.compile(r"^[a-z]+[-_][0-9a-f]{16}-[0-9a-f]{8,32}$")


def new_request_id(prefix: str = "req", separator: str = "-") -> str:
    """Time-ordered ids (members with equal scores sort by arrival in the pending sorted set) with 128
    random bits: an id cannot be guessed."""
    return f"{prefix}{separator}{time.time_ns():016x}-{os.urandom(16).hex()}"


ENTRY_INDEX_DIGITS = 8  # the hex digits that end the id of one entry of a request of several


def new_request_ids(prefix: str, count: int) -> list[str]:
    """The ids of one API request's ``count`` queue entries (its prompts times its choices): one entry gets
    ``new_request_id``'s; several share every digit but the last eight, their index, so that the queue
    can tell how many API requests its entries belong to (``request_of``)."""
    if count < 1:
        raise ValueError(f"a request has at least one entry, not {count}")
    if count == 1:
        return [new_request_id(prefix)]
    shared = new_request_id(prefix)[:-ENTRY_INDEX_DIGITS]
    return [f"{shared}{index:0{ENTRY_INDEX_DIGITS}x}" for index in range(count)]


def request_of(entry_id: str) -> str:
    """What the entries of one API request have in common (``new_request_ids``): two entries share it only
    if they belong to the same request (the rest is 96 random bits)."""
    return entry_id[:-ENTRY_INDEX_DIGITS]


def is_request_id(text: str, prefix: str, separators: str = "-") -> bool:
    """Whether ``text`` is an id ``new_request_id(prefix, separator)`` could have made with one of
    ``separators`` (checked before it becomes part of a Redis key)."""
    return bool(_ID.match(text)) and any(text.startswith(prefix + sep) for sep in separators)


def new_batch_id() -> str:
    """A batch's id as OpenAI writes one: ``batch_...``."""
    return new_request_id("batch", "_")


def is_batch_id(text: str) -> bool:
    """Whether ``text`` names a batch: ``batch_...``, or ``batch-...`` (the ids of batches created before
    batch ids took OpenAI's form, still found by their id)."""
    return is_request_id(text, "batch", "_-")


_TENANT = re.compile(r"^(anonymous|[0-9a-f]{32})$")


def _checked_tenant(tenant: str) -> str:
    if not _TENANT.match(tenant):
        raise ValueError(f"not a tenant id: {tenant!r}")
    return tenant


@dataclass(frozen=True)
class ServiceKeys:
    service: str

    def __post_init__(self) -> None:
        if not _SERVICE.match(self.service):
            raise ValueError(
                f"service name {self.service!r} must be a DNS label (lowercase letters, digits, '-')"
            )

    def _key(self, *parts: str) -> str:
        return ":".join(("dllm", "{" + self.service + "}", *parts))

    @property
    def pending(self) -> str:
        """Sorted set: request id -> prompt tokens (plus committed tokens for resumed requests)."""
        return self._key("pending")

    @property
    def arrivals(self) -> str:
        """Sorted set: pending request id -> when it was first enqueued (ms, Redis's clock): who waited
        longest. A request taken back from a worker keeps its first time."""
        return self._key("arrivals")

    @property
    def batch_pending(self) -> str:
        """Sorted set: the batch lane's pending request id -> prompt tokens (as ``pending``). Batch lines
        wait here, claimed after the interactive lane's requests (and when they have waited long)."""
        return self._key("pending", "batch")

    @property
    def batch_arrivals(self) -> str:
        """Sorted set: the batch lane's pending request id -> when it was first enqueued (as ``arrivals``)."""
        return self._key("arrivals", "batch")

    def lane(self, batch_id: str) -> tuple[str, str]:
        """The pending and arrivals sets a request waits in: the batch lane for a batch's line."""
        return (self.batch_pending, self.batch_arrivals) if batch_id else (self.pending, self.arrivals)

    @property
    def batch_leases(self) -> str:
        """Sorted set: batch id -> its lease deadline (ms), for every batch not yet ended. A gateway holds
        a batch's lease while it ingests and finalizes it; any gateway takes over one whose lease expired."""
        return self._key("batches", "leases")

    @property
    def sizes(self) -> str:
        """Hash: live request id -> "<prompt tokens> <max tokens> <enqueued ms> <head start ms>" (enqueued as
        its priority dates it: the real time less the head start), what a worker needs to
        decide whether a candidate is admissible before it claims it."""
        return self._key("sizes")

    @property
    def inflight(self) -> str:
        """Sorted set: request id -> lease deadline in milliseconds since the epoch."""
        return self._key("inflight")

    @property
    def live(self) -> str:
        """Set of every accepted request not yet done (pending in either lane, or in flight). Its size is
        the queue depth, batch backlog included: the number the operator's autoscaler and KEDA read."""
        return self._key("live")

    @property
    def cancelled(self) -> str:
        """Set of in-flight request ids whose client cancelled them."""
        return self._key("cancelled")

    @property
    def wakeup(self) -> str:
        """Pub/sub channel announcing new pending work to idle workers."""
        return self._key("wakeup")

    @property
    def served_model(self) -> str:
        """String: the JSON record of the model ``dllm serve`` last served on this queue
        (``model_identity.ServedRecord``); a start with another model over waiting work is refused."""
        return self._key("model")

    @property
    def workers(self) -> str:
        """Hash: worker id -> JSON heartbeat (for status and autoscaling)."""
        return self._key("workers")

    def request(self, request_id: str) -> str:
        """Hash: payload, state, generated (committed blocks), worker, result."""
        return self._key("req", request_id)

    def events(self, request_id: str) -> str:
        """Stream of JSON events (field ``e``) for the waiting gateway: one per committed block, then one
        'done'. Read with a cursor, never popped, so a reply lost to a fault loses no event."""
        return self._key("events", request_id)

    def doorbell(self, gateway: str) -> str:
        """Stream one gateway process's event reader blocks on beside its requests' events: an entry wakes
        the read, so that it takes in requests that started waiting meanwhile."""
        return self._key("doorbell", gateway)

    def batch(self, batch_id: str) -> str:
        """Hash: batch metadata, timestamps and counters (total, completed, failed)."""
        return self._key("batch", batch_id)

    def batch_results(self, batch_id: str) -> str:
        """Hash: request id (or ``line:<n>`` for a line that never ran) -> {"id", "done"} or {"line"} JSON,
        one per finished line of the batch, set once (a line's result is recorded and counted once)."""
        return self._key("batch", batch_id, "results")

    def batch_members(self, batch_id: str) -> str:
        """List of the request ids a batch enqueued (what cancelling the batch cancels)."""
        return self._key("batch", batch_id, "members")

    def batch_finalizing(self, batch_id: str) -> str:
        """String with an expiry: held by the gateway writing a batch's output and error files."""
        return self._key("batch", batch_id, "finalizing")

    def file(self, file_id: str) -> str:
        """Hash: a file's record: metadata, tenant and where its bytes are (uploaded, or a batch's output or
        errors); the bytes are in the file store (``gateway.file_store``)."""
        return self._key("file", file_id)

    @property
    def files_expiring(self) -> str:
        """Sorted set: file id -> when its retention ends (seconds): what the file sweeper removes then,
        record and bytes (see ``gateway.file_sweeper``)."""
        return self._key("files", "expiring")

    @property
    def files_uploading(self) -> str:
        """Sorted set: file id -> when its bytes started to be written (seconds), until its record is
        committed: an entry left behind (its gateway died) names bytes the sweeper removes."""
        return self._key("files", "uploading")

    @property
    def files_trash(self) -> str:
        """Sorted set: file id -> when its record was dropped (seconds): bytes to remove from the store."""
        return self._key("files", "trash")

    def storage_used(self, tenant: str) -> str:
        """String: the bytes of a tenant's files (what its storage quota is checked against)."""
        return self._key("storage", _checked_tenant(tenant))

    def files_of(self, tenant: str) -> str:
        """Sorted set: a tenant's file ids by creation time (seconds): what ``GET /v1/files`` lists."""
        return self._key("files", _checked_tenant(tenant))

    def batches_of(self, tenant: str) -> str:
        """Sorted set: a tenant's batch ids by creation time (seconds): what ``GET /v1/batches`` lists."""
        return self._key("batches", _checked_tenant(tenant))

    def limits_of(self, tenant: str) -> str:
        """Hash: a tenant's fixed one-minute window: ``window`` (its start, ms of Redis's clock), the
        ``requests`` and ``tokens`` admitted in it. Expires shortly after its window."""
        return self._key("limits", _checked_tenant(tenant))

    def running_of(self, tenant: str) -> str:
        """Sorted set: a tenant's requests in flight (an admission ticket each) -> when the ticket expires
        (ms): a ticket is removed when its request ends, or expires with the request's deadline (a gateway
        that died holding it leaks nothing)."""
        return self._key("limits", _checked_tenant(tenant), "running")

    def batch_lines_of(self, tenant: str) -> str:
        """Hash: a tenant's batches not yet ended -> "<lines> <expiry ms>": the batch lines it has queued,
        released when the batch ends or at the expiry (its completion window, and a margin)."""
        return self._key("limits", _checked_tenant(tenant), "batch-lines")
