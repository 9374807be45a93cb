"""JSON messages on the queue: the request payload, per-block events and the final result."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

FINISH_REASONS = ("stop", "length", "cancelled", "error", "expired")
BATCH_META = "batch"  # the meta entry naming the batch a request belongs to (absent: none)


@dataclass
class QueuedRequest:
    """What the gateway enqueues; the worker needs nothing else to run it."""

    id: str
    prompt_ids: list[int]
    max_tokens: int
    created: float
    threshold: float | None = None  # per-request override of the service's confidence threshold
    stream: bool = False
    meta: dict[str, Any] = field(default_factory=dict)  # API-level details the worker passes through
    sampling: dict[str, Any] | None = None  # SamplingParams' fields; None: greedy
    logprobs: int | None = None  # None: none; k: each token's log probability and k alternatives

    @property
    def batch_id(self) -> str:
        return str(self.meta.get(BATCH_META, ""))

    def to_json(self) -> str:
        return json.dumps(vars(self), separators=(",", ":"))  # its fields (asdict would copy them first)

    @classmethod
    def from_json(cls, text: str | bytes) -> QueuedRequest:
        return cls(**json.loads(text))


@dataclass
class BlockEvent:
    index: int  # block number within the generation
    token_ids: list[int]
    logprobs: list | None = None  # per token, when the request asked (see DoneEvent.logprobs)
    type: str = "block"


@dataclass
class DoneEvent:
    token_ids: list[int]  # every committed token (whole blocks; EOS and what follows included)
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int  # up to and including the first EOS
    worker: str = ""
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # the request's meta, passed through (batch custom_id)
    # per token, when asked: [log p, [[alternative id, log p], ...]] (None: a block whose record was lost)
    logprobs: list | None = None
    type: str = "done"

    @property
    def batch_id(self) -> str:
        return str(self.meta.get(BATCH_META, ""))


def encode_event(event: BlockEvent | DoneEvent) -> str:
    return json.dumps(vars(event), separators=(",", ":"))


EVENT_FIELD = "e"  # the field that holds an event's JSON in a request's events stream


def decode_event(text: str | bytes) -> BlockEvent | DoneEvent:
    data = json.loads(text)
    kind = data.pop("type", None)
    if kind == "block":
        return BlockEvent(**data)
    if kind == "done":
        return DoneEvent(**data)
    raise ValueError(f"unknown queue event type {kind!r}")
