"""Ids from clients, checked before they become part of a Redis key, and Redis replies as text."""

from __future__ import annotations

from engine_pod.queue.keys import is_request_id


def known_form(identifier: str, prefix: str) -> bool:
    """Whether ``identifier`` has the form of an id this gateway issues (``<batch>:results`` does not:
    it would name another key)."""
    return is_request_id(identifier, prefix)


def as_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
