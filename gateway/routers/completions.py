"""POST /v1/completions and /v1/chat/completions, with server-sent events for stream=true."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from redis.exceptions import RedisError

from engine_pod.queue.messages import BlockEvent, DoneEvent, QueuedRequest
from gateway.errors import ApiError, error_body
from gateway.logprobs import chat_logprobs, completion_logprobs
from gateway.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from gateway.state import State, require_api_key
from gateway.submission import (
    apply_stop,
    build_choices,
    cancel_quietly,
    check_decoding_fields,
    enqueue_all,
    events,
    finish_reason,
    wait_done,
)
from gateway.tokenizer import TokenizerError

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
logger = logging.getLogger(__name__)


def _usage(done_events: list[DoneEvent]) -> Usage:
    prompt = sum(d.prompt_tokens for d in done_events)
    completion = sum(d.completion_tokens for d in done_events)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _prompts(body: CompletionRequest, state) -> list[list[int]]:
    prompt = body.prompt
    limit = state.settings.max_prompts_per_request
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) and len(prompt) > limit:
        raise ApiError(
            400, f"{len(prompt)} prompts in one request; this service takes at most {limit}", param="prompt"
        )
    if isinstance(prompt, str):
        return [state.tokenizer.encode(prompt)]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if prompt and all(isinstance(p, str) for p in prompt):
        return [state.tokenizer.encode(p) for p in prompt]
    raise ApiError(400, "prompt must be a string, a list of strings, or a list of token ids", param="prompt")


@router.post("/completions", response_model=CompletionResponse)
async def completions(body: CompletionRequest, request: Request, state: State):
    started = time.monotonic()
    check_decoding_fields(body, state)
    queued = [choice for ids in _prompts(body, state) for choice in build_choices(ids, body, state)]
    if body.stream and len(queued) > 1:
        raise ApiError(400, "stream=true takes a single prompt", param="stream")
    await enqueue_all(queued, state)  # every prompt or none
    if body.stream:
        return _sse(_stream(queued[0], body, state, chat=False), state, "completions", started)
    results = await asyncio.gather(*(wait_done(q, state, request.is_disconnected) for q in queued))
    choices = [
        _completion_choice(index, done, queued[index], body, state) for index, done in enumerate(results)
    ]
    _observe(state, "completions", started)
    return CompletionResponse(
        id=queued[0].id,
        created=int(queued[0].created),
        model=body.model,
        choices=choices,
        usage=_usage(list(results)),
    )


def _completion_choice(index: int, done: DoneEvent, queued: QueuedRequest, body, state) -> CompletionChoice:
    text, stopped = apply_stop(state.tokenizer.decode(done.token_ids), body.stop_strings())
    echoed = queued.prompt_ids if body.echo else []
    logprobs = None if body.logprobs is None else completion_logprobs(done, state.tokenizer, echoed)
    prefix = state.tokenizer.decode(echoed) if body.echo else ""
    return CompletionChoice(
        index=index, text=prefix + text, finish_reason=finish_reason(done, stopped), logprobs=logprobs
    )


@router.post("/chat/completions", response_model=ChatCompletionResponse)
async def chat_completions(body: ChatCompletionRequest, request: Request, state: State):
    started = time.monotonic()
    check_decoding_fields(body, state)
    try:
        prompt_ids = state.tokenizer.encode_chat(
            [m.model_dump(include={"role", "content"}) for m in body.messages]
        )
    except TokenizerError as exc:
        raise ApiError(400, str(exc), param="messages") from exc
    queued = build_choices(prompt_ids, body, state)
    await enqueue_all(queued, state)  # every choice or none
    if body.stream:
        return _sse(_stream(queued[0], body, state, chat=True), state, "chat", started)
    results = await asyncio.gather(*(wait_done(q, state, request.is_disconnected) for q in queued))
    choices = []
    for index, done in enumerate(results):
        text, stopped = apply_stop(state.tokenizer.decode(done.token_ids), body.stop_strings())
        message = AssistantMessage(content=text)
        logprobs = chat_logprobs(done, state.tokenizer) if body.logprobs else None
        reason = finish_reason(done, stopped)
        choices.append(ChatChoice(index=index, message=message, finish_reason=reason, logprobs=logprobs))
    _observe(state, "chat", started)
    return ChatCompletionResponse(
        id=queued[0].id,
        created=int(queued[0].created),
        model=body.model,
        choices=choices,
        usage=_usage(list(results)),
    )


def _observe(state, endpoint: str, started: float) -> None:
    state.metrics.latency.labels(endpoint).observe(time.monotonic() - started)


def _sse(chunks: AsyncIterator[dict], state, endpoint: str, started: float) -> StreamingResponse:
    """Server-sent events. The status line is already sent when the first chunk goes out, so a failure
    after it is an error event (OpenAI's error object) followed by ``[DONE]``, never a silent cut."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield _event(chunk)
        except ApiError as exc:
            yield _event(error_body(exc.message, exc.kind, exc.param))
        except RedisError as exc:
            logger.warning("stream ended by a Redis error: %s", exc)
            yield _event(error_body(f"the queue failed ({type(exc).__name__}); retry", "server_error"))
        yield b"data: [DONE]\n\n"
        _observe(state, endpoint, started)

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _chunk(queued: QueuedRequest, body, text: str, reason: str | None, chat: bool) -> dict:
    if chat:
        delta = {"role": "assistant", "content": text} if text or reason is None else {}
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
        kind = "text_completion"
    return {
        "id": queued.id,
        "object": kind,
        "created": int(queued.created),
        "model": body.model,
        "choices": [choice],
    }


async def _stream(queued: QueuedRequest, body, state, chat: bool) -> AsyncIterator[dict]:
    """One chunk per committed block carrying the new text; the last one says why generation ended, and
    with ``stream_options.include_usage`` a final chunk with no choices carries the usage.

    Text never goes past ``max_tokens`` tokens (a block can). Block events are numbered; after a gap (a
    block the worker could not publish during a Redis fault) no more block chunks go out, and the done
    event, which carries every token, sends the rest.
    """
    tokens: list[int] = []
    sent = ""
    stops = body.stop_strings()
    contiguous = True
    if not chat and body.echo:
        yield _chunk(queued, body, state.tokenizer.decode(queued.prompt_ids), None, chat)
    async for event in events(queued, state):
        if isinstance(event, BlockEvent):
            contiguous = contiguous and event.index == len(tokens) // state.settings.block_length
            if not contiguous:
                continue
            tokens.extend(event.token_ids)
            text, stopped = apply_stop(state.tokenizer.decode(tokens[: queued.max_tokens]), stops)
            if text != sent and text.startswith(sent):
                yield _chunk(queued, body, text[len(sent) :], None, chat)
                sent = text
            if stopped:
                await cancel_quietly(queued, state)
                yield _chunk(queued, body, "", "stop", chat)
                if _wants_usage(body):
                    yield _usage_chunk(
                        queued, body, len(queued.prompt_ids), min(len(tokens), queued.max_tokens)
                    )
                return
        elif isinstance(event, DoneEvent):
            text, stopped = apply_stop(state.tokenizer.decode(event.token_ids), stops)
            if text.startswith(sent) and text != sent:
                yield _chunk(queued, body, text[len(sent) :], None, chat)
            yield _chunk(queued, body, "", finish_reason(event, stopped), chat)
            if _wants_usage(body):
                yield _usage_chunk(queued, body, event.prompt_tokens, event.completion_tokens)


def _wants_usage(body) -> bool:
    return bool((body.stream_options or {}).get("include_usage"))


def _usage_chunk(queued: QueuedRequest, body, prompt_tokens: int, completion_tokens: int) -> dict:
    """The last chunk, as OpenAI sends it with include_usage: no choices, only the usage."""
    return {
        "id": queued.id,
        "object": "chat.completion.chunk" if isinstance(body, ChatCompletionRequest) else "text_completion",
        "created": int(queued.created),
        "model": body.model,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
