"""What a service's queue holds, as ``dllm serve`` tells its user: interactive API requests (each one entry
per prompt and choice: a request with ``n`` 4 is four entries, one request) and batch lines."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_contracts.queue.keys import ServiceKeys, request_of
from dllm_contracts.queue.ops import as_text


@dataclass(frozen=True)
class Census:
    requests: int  # interactive API requests accepted and not done
    choices: int  # their entries in the queue: one per prompt and choice
    batch_lines: int  # batch lines accepted and not done

    def __str__(self) -> str:
        parts = []
        if self.requests or not self.batch_lines:
            parts.append(_count(self.requests, "request"))
            if self.choices != self.requests:
                parts[-1] += f" ({_count(self.choices, 'choice')})"
        if self.batch_lines:
            parts.append(_count(self.batch_lines, "batch line"))
        return " and ".join(parts)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def interactive_entries(client, keys: ServiceKeys) -> list[str]:
    """The ids of the queue's interactive entries accepted and not done: pending in the interactive lane, or
    in flight and of no batch."""
    pending = as_text(client.zrange(keys.pending, 0, -1))
    in_flight = as_text(client.zrange(keys.inflight, 0, -1))
    if not in_flight:
        return pending
    pipe = client.pipeline(transaction=False)
    for request_id in in_flight:
        pipe.hget(keys.request(request_id), "batch")
    return pending + [request_id for request_id, batch in zip(in_flight, pipe.execute()) if not batch]


def take_census(client, service: str) -> Census:
    keys = ServiceKeys(service)
    live = int(client.scard(keys.live))
    entries = interactive_entries(client, keys)
    return Census(len({request_of(entry) for entry in entries}), len(entries), max(0, live - len(entries)))


def census_of(redis_url: str, service: str) -> Census | None:
    """The queue's census, or None when its Redis does not answer (at once)."""
    from dllm_contracts.queue.connect import sync_client

    try:
        client = sync_client(redis_url, socket_timeout=1, socket_connect_timeout=1)
        try:
            return take_census(client, service)
        finally:
            client.close()
    except Exception:  # noqa: BLE001 (any failure only means the count is not known)
        return None
