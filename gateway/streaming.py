"""Server-sent events for stream=true: every choice's chunks as its blocks are committed, merged.

Each choice (``n`` of them per prompt, for each prompt of a completions request) is its own queued
request; their chunks go out as they come, each with its choice ``index``. With
``stream_options.include_usage`` a final chunk with empty ``choices`` carries the usage of all of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson

from dllm_contracts.queue.messages import BlockEvent, DoneEvent, QueuedRequest
from dllm_contracts.queue.resilience import REDIS_ERRORS
from gateway.chat_answers import answers_with_calls
from gateway.errors import ApiError, error_body
from gateway.event_stream import EventStream
from gateway.logprobs import StreamedLogprobs, held_back, visible_tokens
from gateway.submission import (
    apply_stop,
    cancel_quietly,
    count_covering,
    events,
    finish_reason,
    prompt_tokens_of,
    tokens_shown,
)
from gateway.tool_calls import CallStream, is_calls

logger = logging.getLogger(__name__)


@dataclass
class StreamSpec:
    """What every choice of one streamed response shares."""

    body: object  # the CompletionRequest or ChatCompletionRequest
    state: object  # the gateway's state
    chat: bool
    created: int
    response_id: str

    @property
    def kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def envelope(self, choices: list[dict]) -> dict:
        return {
            "id": self.response_id,
            "object": self.kind,
            "created": self.created,
            "model": self.body.model,
            "system_fingerprint": self.state.settings.system_fingerprint,
            "choices": choices,
        }

    def chunk(
        self, index: int, text: str, reason: str | None, logprobs: dict | None = None, first: bool = False
    ) -> dict:
        """One choice's chunk. A chat's ``delta`` says the role in the choice's ``first`` chunk only (as
        OpenAI's do); a last chunk that adds no text has an empty delta."""
        if self.chat:
            delta = {"content": text} if text or reason is None or first else {}
            delta = {"role": "assistant"} | delta if first else delta
            choice = {"index": index, "delta": delta, "finish_reason": reason, "logprobs": logprobs}
        else:
            choice = {"index": index, "text": text, "finish_reason": reason, "logprobs": logprobs}
        return self.envelope([choice])

    def calls_chunk(self, index: int, calls: list[dict], first: bool) -> dict:
        """One choice's chunk of tool-call deltas (``tool_calls.CallStream``)."""
        delta = ({"role": "assistant", "content": None} if first else {}) | {"tool_calls": calls}
        return self.envelope([{"index": index, "delta": delta, "finish_reason": None, "logprobs": None}])

    def wants_usage(self) -> bool:
        return self.body.wants_usage()


@dataclass
class _Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Choice:
    """One choice's progress: the tokens received, the text sent, the log probabilities described."""

    def __init__(self, spec: StreamSpec, index: int, queued: QueuedRequest) -> None:
        self.spec, self.index, self.queued = spec, index, queued
        self.tokens: list[int] = []
        self.entries: list = []
        self.sent = ""
        self.stops = spec.body.stop_strings()
        wants = spec.body.alternatives() is not None
        self.logprobs = StreamedLogprobs(spec.state.tokenizer, spec.chat) if wants else None
        self.started = False  # whether its first chunk went out
        # an answer that may make calls: streamed as calls once it starts with one (else as content)
        self.calls = CallStream(queued.id) if spec.chat and answers_with_calls(spec.body) else None
        self.making_calls: bool | None = None if self.calls is not None else False

    def reason(self, reason: str) -> str:
        """The finish reason of an answer that ended with ``reason``: ``tool_calls`` for calls that ended."""
        return "tool_calls" if self.making_calls and reason == "stop" else reason

    def chunk(self, text: str, reason: str | None, logprobs: dict | None = None) -> dict:
        first, self.started = not self.started, True
        return self.spec.chunk(self.index, text, reason, logprobs, first)

    def text_of(self, tokens: list[int]) -> tuple[str, bool]:
        return apply_stop(self.spec.state.tokenizer.decode(tokens), self.stops)

    def advance(self, text: str, entries: list | None, final: bool) -> dict | None:
        """The chunk that sends what ``text`` adds to what was sent, with the log probabilities of the
        tokens it completes (None: nothing new). Until the text is ``final`` a character whose bytes have
        not all come (a block ended inside it: decoded as U+FFFD) waits for the block that completes it."""
        text = text if final else held_back(text)
        if self.making_calls is None:  # not yet known whether the answer makes calls
            self.making_calls = is_calls(text)
            if self.making_calls is None and not final:
                return None
        if self.making_calls:
            deltas = self.calls.deltas(text)
            if not deltas:
                return None
            first, self.started = not self.started, True
            return self.spec.calls_chunk(self.index, deltas, first)
        new = ""
        if text != self.sent and text.startswith(self.sent):
            new, self.sent = text[len(self.sent) :], text
        described = None
        if self.logprobs is not None:
            visible = visible_tokens(self.tokens, entries, self.spec.state.tokenizer)
            described = self.logprobs.take(visible, len(self.sent))
        if not new and described is None:
            return None
        return self.chunk(new, None, described)


async def _choice_chunks(choice: _Choice, usage: _Usage) -> AsyncIterator[dict]:
    """One choice's chunks: one per committed block carrying the new text; the last one says why
    generation ended. The worker cuts block events and the result to ``max_tokens``. Block events are
    numbered; after a gap (a block the worker could not publish during a Redis fault) no more block
    chunks go out, and the done event, which carries every token, sends the rest. A block's text goes
    where its event's offset says (the generated tokens before it), whatever the family's block layout."""
    spec, queued = choice.spec, choice.queued
    contiguous = True
    if not spec.chat and spec.body.echo:
        prompt = spec.state.tokenizer.decode(queued.prompt_ids)
        echoed = choice.logprobs.echoed(queued.prompt_ids) if choice.logprobs is not None else None
        yield choice.chunk(prompt, None, echoed)
    async for event in events(queued, spec.state):
        if isinstance(event, BlockEvent):
            contiguous = contiguous and event.offset == len(choice.tokens)
            if not contiguous:
                continue
            choice.tokens.extend(event.token_ids)
            choice.entries.extend(event.logprobs or [None] * len(event.token_ids))
            text, stopped = choice.text_of(choice.tokens)
            chunk = choice.advance(text, choice.entries, final=stopped)
            if chunk is not None:
                yield chunk
            if stopped:
                await cancel_quietly(queued, spec.state)
                yield choice.chunk("", choice.reason("stop"))
                usage.completion_tokens += count_covering(choice.tokens, spec.state.tokenizer, len(text))
                return
        elif isinstance(event, DoneEvent):
            choice.tokens = list(event.token_ids)
            text, stopped = choice.text_of(choice.tokens)
            chunk = choice.advance(text, event.logprobs, final=True)
            if chunk is not None:
                yield chunk
            yield choice.chunk("", choice.reason(finish_reason(event, stopped)))
            usage.completion_tokens += tokens_shown(event, spec.state.tokenizer, text, stopped)


async def _merged(streams: list[AsyncIterator[dict]]) -> AsyncIterator[dict]:
    """The chunks of every stream as they come. The first failure ends them all (each stream cancels
    its request when it is cancelled: see ``submission.events``)."""
    if len(streams) == 1:
        async for chunk in streams[0]:
            yield chunk
        return
    queue: asyncio.Queue = asyncio.Queue()
    finished = object()

    async def pump(stream: AsyncIterator[dict]) -> None:
        try:
            async for chunk in stream:
                await queue.put(chunk)
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put(exc)
            return
        await queue.put(finished)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is finished:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_chunks(spec: StreamSpec, queued: list[QueuedRequest]) -> AsyncIterator[dict]:
    """Every choice's chunks, then (with include_usage) the usage of all of them in a last chunk."""
    usage = _Usage(prompt_tokens=prompt_tokens_of(queued, spec.body.n))
    choices = [_Choice(spec, index, request) for index, request in enumerate(queued)]
    async for chunk in _merged([_choice_chunks(choice, usage) for choice in choices]):
        yield chunk
    if spec.wants_usage():
        total = usage.prompt_tokens + usage.completion_tokens
        last = spec.envelope([])
        last["usage"] = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": total,
        }
        yield last


def sse(chunks: AsyncIterator[dict], on_end) -> EventStream:
    """Server-sent events. The status line is already sent when the first chunk goes out, so a failure
    after it is an error event (OpenAI's error object) followed by ``[DONE]``, never a silent cut."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield _event(chunk)
        except ApiError as exc:
            yield _event(error_body(exc.message, exc.kind, exc.param))
        except REDIS_ERRORS as exc:
            logger.warning("stream ended by a Redis error: %s", exc)
            yield _event(error_body(f"the queue failed ({type(exc).__name__}); retry", "server_error"))
        yield b"data: [DONE]\n\n"
        on_end()

    return EventStream(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _event(payload: dict) -> bytes:
    """One event. A log probability of -inf (a token outside a truncated distribution) is written as
    null, as pydantic writes it in a whole answer (JSON has no infinity); text orjson cannot encode (a
    lone surrogate) is escaped by json."""
    try:
        encoded = orjson.dumps(payload)
    except orjson.JSONEncodeError:
        encoded = json.dumps(payload).encode()
    return b"data: " + encoded + b"\n\n"
