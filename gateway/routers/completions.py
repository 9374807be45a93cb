"""POST /v1/completions and /v1/chat/completions (stream=true: see gateway/streaming.py)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from dllm_contracts.queue.messages import DoneEvent, QueuedRequest
from dllm_contracts.tracing import end_span
from gateway.chat_answers import answers_with_calls, chat_message, tools_for_prompt
from gateway.errors import ApiError
from gateway.logprobs import chat_logprobs, completion_logprobs
from gateway.rate_limits import Admitted
from gateway.request_trace import carry, traced
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
from gateway.streaming import StreamSpec, sse, stream_chunks
from gateway.submission import (
    apply_stop,
    as_one_request,
    build_choices,
    check_prompt_text,
    check_request,
    enqueue_all,
    finish_reason,
    prompt_tokens_of,
    request_params,
    tokens_shown,
    wait_all,
)
from gateway.tokenizer import TokenizerError

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


# Answers are built with model_construct: their fields are this module's own values, already of the right
# types, and validating them again would be work for nothing on every request.


def _usage(completion_tokens: list[int], queued: list[QueuedRequest], n: int) -> Usage:
    """Every choice's completion tokens; each prompt's tokens once, however many choices it has (as
    OpenAI counts them)."""
    prompt = prompt_tokens_of(queued, n)
    completion = sum(completion_tokens)
    return Usage.model_construct(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def _prompts(body: CompletionRequest, state) -> list[list[int]]:
    """The prompts as token ids: one text, several texts, one list of ids, or several lists of ids."""
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    elif prompt and isinstance(prompt[0], int):
        return [list(prompt)]
    limit = state.settings.max_prompts_per_request
    if not prompt:
        raise ApiError(400, "prompt is an empty list", param="prompt", code="array_below_min_length")
    if len(prompt) > limit:
        raise ApiError(
            400,
            f"{len(prompt)} prompts in one request; this service takes at most {limit}",
            param="prompt",
            code="array_above_max_length",
        )
    if isinstance(prompt[0], list):
        return [list(ids) for ids in prompt]
    for text in prompt:
        check_prompt_text([text], state)
    return [state.tokenizer.encode(text) for text in prompt]


@router.post("/completions", response_model=CompletionResponse)
async def completions(body: CompletionRequest, request: Request, state: State):
    """What this route answers is what ``gateway.fast_path`` serves (the route describes it in the
    OpenAPI document, and answers where the fast path is not installed)."""
    return await complete(body, state, request.is_disconnected)


async def complete(
    body: CompletionRequest, state, is_disconnected, admitted: Admitted | None = None
) -> CompletionResponse | StreamingResponse:
    """``admitted``: the caller, whose limits the request is counted against (None: none)."""
    return await traced(state, "completions", _complete, body, is_disconnected, admitted)


async def _complete(body: CompletionRequest, state, is_disconnected, admitted=None, span=None):
    started = time.monotonic()
    check_request(body, state)
    params = request_params(body, state)
    queued = as_one_request(
        [choice for ids in _prompts(body, state) for choice in build_choices(ids, body, state, params)]
    )
    carry(queued, span)
    await enqueue_all(queued, state, admitted)  # every prompt or none
    if body.stream:
        return _streamed(queued, body, state, False, started, span)
    results = await wait_all(queued, state, is_disconnected)
    choices, counts = zip(
        *(_completion_choice(index, done, queued[index], body, state) for index, done in enumerate(results))
    )
    _observe(state, "completions", started, span)
    return CompletionResponse.model_construct(
        id=queued[0].id,
        created=int(queued[0].created),
        model=body.model,
        system_fingerprint=state.settings.system_fingerprint,
        choices=list(choices),
        usage=_usage(list(counts), queued, body.n),
    )


def _completion_choice(
    index: int, done: DoneEvent, queued: QueuedRequest, body, state
) -> tuple[CompletionChoice, int]:
    """The choice and the completion tokens its text shows."""
    text, stopped = apply_stop(state.tokenizer.decode(done.token_ids), body.stop_strings())
    echoed = queued.prompt_ids if body.echo else []
    cut = len(text) if stopped else None
    logprobs = None if body.logprobs is None else completion_logprobs(done, state.tokenizer, echoed, cut)
    prefix = state.tokenizer.decode(echoed) if body.echo else ""
    reason = finish_reason(done, stopped)
    choice = CompletionChoice.model_construct(
        index=index, text=prefix + text, finish_reason=reason, logprobs=logprobs
    )
    return choice, tokens_shown(done, state.tokenizer, text, stopped)


@router.post("/chat/completions", response_model=ChatCompletionResponse)
async def chat_completions(body: ChatCompletionRequest, request: Request, state: State):
    """See ``completions``: ``gateway.fast_path`` serves this."""
    return await chat(body, state, request.is_disconnected)


async def chat(
    body: ChatCompletionRequest, state, is_disconnected, admitted: Admitted | None = None
) -> ChatCompletionResponse | StreamingResponse:
    return await traced(state, "chat", _chat, body, is_disconnected, admitted)


async def _chat(body: ChatCompletionRequest, state, is_disconnected, admitted=None, span=None):
    started = time.monotonic()
    check_request(body, state)
    params = request_params(body, state)
    prompt_ids = chat_prompt(body, state)
    queued = as_one_request(build_choices(prompt_ids, body, state, params))
    carry(queued, span)
    await enqueue_all(queued, state, admitted)  # every choice or none
    if body.stream:
        return _streamed(queued, body, state, True, started, span)
    results = await wait_all(queued, state, is_disconnected)
    choices, counts = [], []
    with_calls = answers_with_calls(body)
    for index, done in enumerate(results):
        text, stopped = apply_stop(state.tokenizer.decode(done.token_ids), body.stop_strings())
        fields, reason = chat_message(text, finish_reason(done, stopped), with_calls, queued[index].id)
        message = AssistantMessage.model_construct(**fields)
        cut = len(text) if stopped else None
        logprobs = chat_logprobs(done, state.tokenizer, cut) if body.logprobs else None
        choices.append(
            ChatChoice.model_construct(index=index, message=message, finish_reason=reason, logprobs=logprobs)
        )
        counts.append(tokens_shown(done, state.tokenizer, text, stopped))
    _observe(state, "chat", started, span)
    return ChatCompletionResponse.model_construct(
        id=queued[0].id,
        created=int(queued[0].created),
        model=body.model,
        system_fingerprint=state.settings.system_fingerprint,
        choices=choices,
        usage=_usage(counts, queued, body.n),
    )


def chat_prompt(body: ChatCompletionRequest, state) -> list[int]:
    """The messages rendered by the model's chat template, as token ids (too long: refused, before
    tokenizing when the text alone shows it)."""
    messages = [message.for_template() for message in body.messages]
    check_prompt_text([m["content"] for m in messages], state, "messages")
    try:
        return state.tokenizer.encode_chat(messages, tools_for_prompt(body))
    except TokenizerError as exc:
        raise ApiError(400, str(exc), param="messages", code="invalid_value") from exc


def _observe(state, endpoint: str, started: float, span=None) -> None:
    """An answer complete: its latency (per endpoint, and end to end by model and lane), its span ended."""
    seconds = time.monotonic() - started
    state.metrics.latency.labels(endpoint).observe(seconds)
    state.metrics.observe_e2e(seconds)
    end_span(span)


def _streamed(queued: list[QueuedRequest], body, state, chat: bool, started: float, span=None):
    spec = StreamSpec(body, state, chat, int(queued[0].created), queued[0].id)
    endpoint = "chat" if chat else "completions"
    return sse(stream_chunks(spec, queued), lambda: _observe(state, endpoint, started, span))
