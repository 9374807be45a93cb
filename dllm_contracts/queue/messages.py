"""JSON messages on the queue: the request payload, per-block events and the final result.

Encoded and decoded by orjson (about five times faster than the standard library's json on these
messages, which every request crosses twice), except where a message can hold a float that is not
finite: the log probabilities of tokens outside a truncated distribution are -inf, which orjson would
write as null, so events with log probabilities are written by json (as -Infinity) and read back by it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from dllm_contracts.request_params import RequestParams
from dllm_contracts.request_setting import SettingError

FINISH_REASONS = ("stop", "length", "cancelled", "error", "expired")
BATCH_META = "batch"  # the meta entry naming the batch a request belongs to (absent: none)


@dataclass
class QueuedRequest:
    """What the gateway enqueues; the worker needs nothing else to run it."""

    id: str
    prompt_ids: list[int]
    params: RequestParams  # every setting of the request (its max_tokens among them), as the gateway built it
    created: float
    stream: bool = False
    meta: dict[str, Any] = field(default_factory=dict)  # API-level details the worker passes through
    # the model it was accepted for (model_identity.ModelIdentity's NAME@FINGERPRINT); a worker serving
    # another refuses it rather than answer with other weights. None: accepted without an identity
    model: str | None = None
    # the W3C traceparent of the gateway's request span (dllm_contracts.tracing), sent only while tracing is
    # on: a worker older than this field refuses a payload that has it, so workers are upgraded first
    trace: str | None = None

    @property
    def max_tokens(self) -> int:
        return self.params.max_tokens

    @property
    def batch_id(self) -> str:
        return str(self.meta.get(BATCH_META, ""))

    def to_json(self) -> bytes:
        """The payload: ``max_tokens`` at the top, as every version reads it (the queue's size of the
        request), the other settings that differ from their defaults in ``params`` (left out when none
        do: a worker older than ``params`` serves such a request, and refuses one that has them, by
        name), ``trace`` only when set. Every float in it is finite (validated settings)."""
        data = {name: value for name, value in vars(self).items() if name not in ("params", "trace")}
        data["max_tokens"] = self.params.max_tokens
        settings = self.params.to_wire()
        settings.pop("max_tokens", None)
        if settings:
            data["params"] = settings
        if self.trace is not None:
            data["trace"] = self.trace
        return orjson.dumps(data)

    @classmethod
    def read(cls, text: str | bytes) -> tuple[QueuedRequest, list[str], str | None]:
        """The request, the names of the fields in it that this version does not know (a newer
        gateway's, which a worker refuses the request for, by name), and why its settings are invalid
        (None: they are not; else ``params`` holds one token's greedy settings in their place). A payload
        it cannot read at all would fail every claim that holds it, claim after claim. A gateway older than
        ``params`` queued the settings as top-level fields: read into ``params`` alike."""
        data = loads(text)
        unknown = sorted(set(data) - PAYLOAD_FIELDS - LEGACY_FIELDS)
        settings = data["params"] if "params" in data else _legacy_settings(data)
        invalid = None
        try:
            params = RequestParams.from_wire({**settings, "max_tokens": data.get("max_tokens")})
        except (SettingError, TypeError) as error:
            params, invalid = RequestParams(max_tokens=1), str(error)
        known = {name: data[name] for name in PAYLOAD_FIELDS if name in data and name != "params"}
        return cls(params=params, **known), unknown, invalid


PAYLOAD_FIELDS = {"id", "prompt_ids", "created", "stream", "meta", "model", "trace", "params"}
# a payload's settings before ``params``: max_tokens (still written), threshold, sampling (temperature,
# top_p, top_k, seed), logprobs, sampler (DiffusionGemma's, now ``RequestParams.family``) and grammar
LEGACY_FIELDS = {"max_tokens", "threshold", "sampling", "logprobs", "sampler", "grammar"}


def _legacy_settings(data: dict[str, Any]) -> dict[str, Any]:
    settings = dict(data.get("sampling") or {})
    settings |= {
        name: data[name] for name in ("threshold", "logprobs", "grammar") if data.get(name) is not None
    }
    return settings | ({"family": data["sampler"]} if data.get("sampler") else {})


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
