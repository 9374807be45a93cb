"""Turning an API request into queued requests, and waiting for their results."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from starlette.requests import ClientDisconnect

from dllm_contracts.queue.keys import new_request_id, new_request_ids
from dllm_contracts.queue.messages import BlockEvent, DoneEvent, QueuedRequest
from dllm_contracts.queue.resilience import REDIS_ERRORS, TRANSIENT_ERRORS, Backoff
from dllm_contracts.structured_output import ResponseGrammar
from gateway.errors import ApiError, model_not_found, queue_unreachable, shutting_down
from gateway.metrics import QUEUE_FULL
from gateway.openai_fields import unknown_fields
from gateway.prompt_limits import longest_prompt, prompt_too_long
from gateway.rate_limits import Admitted
from gateway.schemas import CommonFields
from gateway.state import GatewayState

POLL_S = 2.0  # longest wait for an event, so that disconnects, deadlines and shutdown are noticed
logger = logging.getLogger(__name__)


def max_tokens_of(body: CommonFields, state: GatewayState) -> int:
    settings = state.settings
    field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    value = body.max_completion_tokens or body.max_tokens or settings.default_max_tokens
    if value > settings.max_tokens_limit:
        raise ApiError(
            400,
            f"{field} {value} is above this service's limit of {settings.max_tokens_limit}",
            param=field,
            code="integer_above_max_value",
        )
    return value


def check_request(body: CommonFields, state: GatewayState) -> None:
    """What a request's schema alone cannot refuse: another model, fields OpenAI does not define (unless
    the service ignores them), options that need another option, decoding settings that are not the
    service's."""
    settings = state.settings
    if body.model != settings.served_model:
        raise model_not_found(body.model, settings.served_model)
    unknown = unknown_fields(body) if settings.unknown_fields == "reject" else []
    if unknown:
        raise ApiError(400, f"unknown parameter: {unknown[0]!r}", param=unknown[0], code="unknown_parameter")
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            400,
            "stream_options is only allowed with stream: true",
            param="stream_options",
            code="invalid_value",
        )
    if getattr(body, "top_logprobs", None) is not None and not getattr(body, "logprobs", True):
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    _check_decoding_fields(body, settings)


def _check_decoding_fields(body: CommonFields, settings) -> None:
    if body.block_length is not None and body.block_length != settings.block_length:
        raise ApiError(
            400,
            f"block_length {body.block_length}: this service decodes with block_length {settings.block_length}",
            param="block_length",
            code="invalid_value",
        )
    if body.steps is not None and body.steps != settings.steps_per_block:
        raise ApiError(
            400,
            f"steps {body.steps}: this service decodes with {settings.steps_per_block} steps per block",
            param="steps",
            code="invalid_value",
        )
    _check_sampler_fields(body, settings)


def _check_sampler_fields(body: CommonFields, settings) -> None:
    """What the fields' ranges cannot say; the worker checks the settings merged with the model's."""
    steps = body.max_denoising_steps
    if steps is not None and steps > settings.steps_per_block:
        raise ApiError(
            400,
            f"max_denoising_steps {steps} is above this service's {settings.steps_per_block} steps per block",
            param="max_denoising_steps",
            code="integer_above_max_value",
        )
    if body.t_min is not None and body.t_max is not None and body.t_max <= body.t_min:
        raise ApiError(
            400, f"t_max {body.t_max} must be above t_min {body.t_min}", param="t_max", code="invalid_value"
        )


def check_prompt_text(texts: list[str], state: GatewayState, param: str = "prompt") -> None:
    """Refuse a prompt that is surely too long before tokenizing it: no token covers more than the
    tokenizer's longest token (twice that, for normalizers that shrink text), so more bytes than the
    limit times that is more tokens than the limit."""
    per_token = state.tokenizer.max_token_bytes * 2
    size = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
    if size > longest_prompt(state) * per_token:
        raise prompt_too_long(size // per_token, None, state, param, at_least=True)


def check_prompt(prompt_ids: list[int], state: GatewayState, param: str = "prompt", max_tokens=None) -> None:
    """The prompt's tokens: not empty, within the context beside ``max_tokens``, each in the vocabulary."""
    if not prompt_ids:
        raise ApiError(400, "the prompt is empty", param=param, code="invalid_value")
    refusal = prompt_too_long(len(prompt_ids), max_tokens, state, param)
    if refusal is not None:
        raise refusal
    vocab = state.tokenizer.tokenizer.get_vocab_size()
    if any(not 0 <= t < vocab for t in prompt_ids):
        raise ApiError(400, f"prompt token ids must be in [0, {vocab})", param=param, code="invalid_value")


def sampling_of(body: CommonFields, seed: int | None) -> dict | None:
    """The worker's sampling settings for one choice (``seed`` None: the request's own seed, or for a
    sampled request a random one). A greedy choice's carry its seed, where it has one: a model whose
    canvases start from noise (DiffusionGemma) draws that noise with it. None: greedy with seed 0."""
    if not body.temperature and seed is None and body.seed is None:
        return None
    seed = _seed(body) if seed is None else seed
    top_p = 1.0 if body.top_p is None else body.top_p
    return {"temperature": body.temperature or 0.0, "top_p": top_p, "top_k": body.top_k or 0, "seed": seed}


def build_request(
    prompt_ids: list[int],
    body: CommonFields,
    state: GatewayState,
    meta: dict | None = None,
    seed: int | None = None,
    model_identity: str | None = None,
    grammar: ResponseGrammar | None = None,
) -> QueuedRequest:
    """One queued request; its id is the response's (``chatcmpl-...`` for a chat, ``cmpl-...`` else). It
    carries the identity of the model it is accepted for: ``model_identity`` (a batch's, recorded when it
    was created), else the gateway's; and the grammar its answer keeps to (``response_grammar``)."""
    chat = hasattr(body, "messages")
    max_tokens = max_tokens_of(body, state)
    check_prompt(prompt_ids, state, "messages" if chat else "prompt", max_tokens)
    return QueuedRequest(
        id=new_request_id("chatcmpl" if chat else "cmpl"),
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        created=time.time(),
        threshold=body.threshold,
        stream=body.stream,
        meta=meta or {},
        sampling=sampling_of(body, seed),
        logprobs=body.alternatives(),
        sampler=body.sampler_settings(),
        grammar=None if grammar is None else grammar.to_wire(),
        model=model_identity or state.settings.model_identity or None,
    )


def build_choices(
    prompt_ids: list[int], body: CommonFields, state: GatewayState, grammar: ResponseGrammar | None = None
) -> list[QueuedRequest]:
    """``body.n`` requests for one prompt, one per choice: choice i draws with seed + i (the request's
    seed, or a random one), so choices differ from each other and a given seed reproduces them all."""
    if body.n == 1:
        return [build_request(prompt_ids, body, state, grammar=grammar)]
    base = _seed(body)
    return [
        build_request(prompt_ids, body, state, seed=(base + i) % 2**63, grammar=grammar)
        for i in range(body.n)
    ]


def as_one_request(queued: list[QueuedRequest]) -> list[QueuedRequest]:
    """``queued`` (the entries of one API request: its prompts times its choices), renamed so that their ids
    say they belong together (``keys.new_request_ids``); the first one's id is the response's."""
    if len(queued) > 1:
        prefix = queued[0].id.split("-", 1)[0]
        for request, request_id in zip(queued, new_request_ids(prefix, len(queued))):
            request.id = request_id
    return queued


def prompt_tokens_of(queued: list[QueuedRequest], n: int) -> int:
    """The usage's prompt tokens: each prompt once, not once per choice (``queued`` holds ``n`` choices
    per prompt, prompt after prompt)."""
    return sum(len(request.prompt_ids) for request in queued[::n])


def _seed(body: CommonFields) -> int:
    """The request's seed, or a random one (a sampled request without a seed still draws its own)."""
    return body.seed if body.seed is not None else secrets.randbelow(2**62)


async def enqueue_all(
    requests: list[QueuedRequest], state: GatewayState, admitted: Admitted | None = None
) -> None:
    """Accept every request into the queue, or none: 429 when it cannot take them all, or when they are
    over their caller's limits (``admitted``: counted there first, queued with its priority); Redis faults
    are retried (the enqueue script is idempotent) for up to ``enqueue_timeout_s``, then 503."""
    head_start = 0
    if admitted is not None:
        prompts = sum(len(request.prompt_ids) for request in requests)
        await admitted.admit(state, prompts, sum(request.max_tokens for request in requests))
        head_start = admitted.caller.limits.head_start_ms(state.settings)
    give_up = time.monotonic() + state.settings.enqueue_timeout_s
    backoff = Backoff()
    call = state.queue.ops.enqueue_all(requests, state.settings.max_queued, head_start)
    while True:
        try:
            accepted = await state.calls.run(call)
            break
        except TRANSIENT_ERRORS as exc:
            if time.monotonic() >= give_up:
                logger.warning("cannot enqueue %s: %s", requests[0].id, exc)
                raise queue_unreachable("the request was not accepted", state.settings.retry_after_s) from exc
            await asyncio.sleep(backoff.next_delay())
    if not accepted:
        state.metrics.count_rejection(QUEUE_FULL)
        raise ApiError(
            429,
            "the queue is full; retry later",
            "rate_limit_error",
            headers={"Retry-After": str(state.settings.retry_after_s)},
            code="rate_limit_exceeded",
        )


async def events(request: QueuedRequest, state: GatewayState, is_disconnected=None):
    """Yield the request's block events and finally its done event; cancel it on disconnect or timeout.

    The gateway's event reader rides out Redis faults (reading again, with backoff) while the request
    waits up to its deadline, which then ends it with a 504; a gateway shutting down ends it with a 503
    in time for the client to hear it.
    """
    deadline = time.monotonic() + state.settings.request_timeout_s
    delivered = False  # its result reached the consumer: nothing left to cancel
    try:
        while True:
            remaining = min(deadline, state.stop_waiting_at) - time.monotonic()
            if remaining <= 0:
                raise _ended_early(state, deadline)
            event = await state.events.next_event(request.id, min(POLL_S, remaining))
            if isinstance(event, DoneEvent):
                state.delivered.add(request.id)
                delivered = True  # a consumer stops at it: the generator is closed at this yield
                yield event
                return
            if event is not None:
                yield event
            elif is_disconnected is not None and await is_disconnected():
                raise ClientDisconnect
    except (asyncio.CancelledError, GeneratorExit, ApiError, ClientDisconnect):
        if not delivered:
            await cancel_quietly(request, state)
        raise
    finally:
        state.events.leave(request.id)


def _ended_early(state: GatewayState, deadline: float) -> ApiError:
    if time.monotonic() < deadline:
        return shutting_down(state.settings.retry_after_s)
    return ApiError(504, f"no result within {state.settings.request_timeout_s:.0f} s", "timeout_error")


async def cancel_quietly(request: QueuedRequest, state: GatewayState) -> None:
    """Best effort: with Redis away the request stays queued, and its result expires unread."""
    try:
        await state.calls.run(state.queue.ops.cancel(request.id, len(request.prompt_ids), request.batch_id))
    except REDIS_ERRORS as exc:
        logger.warning("could not cancel %s: %s", request.id, exc)


async def wait_all(queued: list[QueuedRequest], state: GatewayState, is_disconnected) -> list[DoneEvent]:
    """Every request's done event, in order (one request is awaited here, without a task of its own)."""
    if len(queued) == 1:
        return [await wait_done(queued[0], state, is_disconnected)]
    return await asyncio.gather(*(wait_done(request, state, is_disconnected) for request in queued))


async def wait_done(request: QueuedRequest, state: GatewayState, is_disconnected=None) -> DoneEvent:
    async for event in events(request, state, is_disconnected):
        if isinstance(event, DoneEvent):
            return event
    raise ApiError(500, "the result stream ended without a result", "server_error")


def apply_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """Cut ``text`` at the earliest stop string; True if one was found."""
    cuts = [text.find(s) for s in stops if s and s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


def tokens_shown(done: DoneEvent, tokenizer, text: str, stopped: bool) -> int:
    """``completion_tokens`` of a result whose text is ``text``: all of them, or where a stop string cut
    the text, the tokens up to the one the cut falls in (the text returned, counted)."""
    if not stopped:
        return done.completion_tokens
    return count_covering(done.token_ids[: done.completion_tokens], tokenizer, len(text))


def count_covering(token_ids: list[int], tokenizer, text_len: int) -> int:
    """The fewest leading tokens whose text is at least ``text_len`` characters long (bisection: the
    decoded length grows with the tokens)."""
    low, high = 0, len(token_ids)
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode(token_ids[:middle])) >= text_len:
            high = middle
        else:
            low = middle + 1
    return low


def finish_reason(done: DoneEvent, stopped: bool) -> str:
    if done.error:
        raise ApiError(400, done.error)
    return "stop" if stopped else done.finish_reason


__all__ = [
    "BlockEvent",
    "DoneEvent",
    "apply_stop",
    "as_one_request",
    "build_choices",
    "build_request",
    "cancel_quietly",
    "check_request",
    "enqueue_all",
    "events",
    "finish_reason",
    "prompt_tokens_of",
    "wait_all",
    "wait_done",
]
