"""JSON messages on the queue: the request payload, per-block events and the final result.

Encoded and decoded by orjson (about five times faster than the standard library's json on these
messages, which every request crosses twice), except where a message can hold a float that is not
finite: the log probabilities of tokens outside a truncated distribution are -inf, which orjson would
write as null, so events with log probabilities are written by json (as -Infinity) and read back by it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

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
    sampling: dict[str, Any] | None = None  # SamplingParams' fields; None: greedy with seed 0
    logprobs: int | None = None  # None: none; k: each token's log probability and k alternatives
    # the entropy-bound sampler's settings the request sets (DiffusionGemma; canvas_sampler.SETTINGS' names,
    # unset ones left out); None: the service's
    sampler: dict[str, Any] | None = None
    # the grammar its answer keeps to (structured_output.ResponseGrammar's wire form); None: free text
    grammar: dict[str, str] | None = None
    # the model it was accepted for (model_identity.ModelIdentity's NAME@FINGERPRINT); a worker serving
    # another refuses it rather than answer with other weights. None: accepted without an identity
    model: str | None = None
    # the W3C traceparent of the gateway's request span (dllm_contracts.tracing), sent only while tracing is
    # on: a worker older than this field refuses a payload that has it, so workers are upgraded first
    trace: str | None = None

    @property
    def batch_id(self) -> str:
        return str(self.meta.get(BATCH_META, ""))

    def to_json(self) -> bytes:
        """Its fields (asdict would copy them first), ``trace`` only when set; every float in it is finite
        (validated settings)."""
        if self.trace is None:
            return orjson.dumps({name: value for name, value in vars(self).items() if name != "trace"})
        return orjson.dumps(vars(self))

    @classmethod
    def read(cls, text: str | bytes) -> tuple[QueuedRequest, list[str]]:
        """The request, and the names of the fields in it that this version does not know: a newer
        gateway's, which a worker refuses the request for, by name (a payload it cannot read at all would
        fail every claim that holds it, claim after claim)."""
        data = loads(text)
        known = {item.name for item in fields(cls)}
        return cls(**{name: value for name, value in data.items() if name in known}), sorted(
            set(data) - known
        )


@dataclass
class BlockEvent:
    index: int  # block number within the generation
    token_ids: list[int]
    logprobs: list | None = None  # per token, when the request asked (see DoneEvent.logprobs)
    # generated tokens before this block's first: where its text goes. Not index x L: on a block-diffusion
    # grid a request's first block carries L minus its prompt's tail
    offset: int = 0
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


def encode_event(event: BlockEvent | DoneEvent) -> bytes | str:
    if event.logprobs is None:
        return orjson.dumps(vars(event))
    return json.dumps(vars(event), separators=(",", ":"))  # -inf stays -Infinity


def loads(text: str | bytes) -> Any:
    """A message's JSON; what orjson refuses (-Infinity, NaN) read by json."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


EVENT_FIELD = "e"  # the field that holds an event's JSON in a request's events stream


def decode_event(text: str | bytes) -> BlockEvent | DoneEvent:
    data = loads(text)
    kind = data.pop("type", None)
    if kind == "block":
        return BlockEvent(**data)
    if kind == "done":
        return DoneEvent(**data)
    raise ValueError(f"unknown queue event type {kind!r}")
