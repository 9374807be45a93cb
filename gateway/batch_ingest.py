"""Batch ingestion in the background (chunked, tokenised off the event loop) and the lines of the output
and error files."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from pydantic import ValidationError

from engine_pod.queue.messages import BATCH_META, DoneEvent, decode_event
from engine_pod.queue.ops import as_text, text_of
from gateway.errors import ApiError
from gateway.logprobs import chat_logprobs, completion_logprobs
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.submission import (
    apply_stop,
    build_request,
    check_prompt_text,
    check_request,
    finish_reason,
    tokens_shown,
)
from gateway.tokenizer import TokenizerError

logger = logging.getLogger(__name__)
_BODY = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}
STOP_META = "stop"  # the meta entry holding a line's stop strings (applied when its output is read)


def _prepare(line_text: str, index: int, endpoint: str, state):
    """A queued request for one input line, or the error line to report instead."""
    custom_id = f"line-{index + 1}"
    try:
        line = json.loads(line_text)
        custom_id = str(line.get("custom_id", custom_id))
        if line.get("url", endpoint) != endpoint:
            raise ApiError(400, f"line url {line.get('url')!r} differs from the batch endpoint {endpoint!r}")
        body = _BODY[endpoint].model_validate(line.get("body") or {})
        if body.stream:
            raise ApiError(400, "stream is not allowed in a batch")
        if body.n > 1:
            raise ApiError(400, "a batch line takes n=1")
        if getattr(body, "echo", False):
            raise ApiError(400, "echo is not supported in a batch line")
        check_request(body, state)
        ids = _prompt_ids(body, state)
        meta = {"custom_id": custom_id, "model": body.model}
        if body.stop_strings():
            meta[STOP_META] = body.stop_strings()
        return build_request(ids, body, state, meta=meta)
    except (json.JSONDecodeError, ValidationError, ApiError, TokenizerError, AttributeError) as exc:
        message = exc.message if isinstance(exc, ApiError) else str(exc).splitlines()[0]
        code = (exc.code if isinstance(exc, ApiError) else None) or "invalid_request"
        return _error_item(index, custom_id, code, message)


def _prompt_ids(body, state) -> list[int]:
    """A line's one prompt as token ids (a chat's messages rendered by the chat template)."""
    if hasattr(body, "messages"):
        messages = [message.for_template() for message in body.messages]
        check_prompt_text([m["content"] for m in messages], state, "messages")
        return state.tokenizer.encode_chat(messages)
    if isinstance(body.prompt, str):
        check_prompt_text([body.prompt], state)
        return state.tokenizer.encode(body.prompt)
    if body.prompt and isinstance(body.prompt[0], int):
        return list(body.prompt)
    raise ApiError(400, "a batch completion line takes one prompt: a string or a list of token ids")


def _error_item(index: int, custom_id: str, code: str, message: str) -> dict:
    """A line that was not queued, as its line of the error file."""
    line = {"id": f"batch_req_line{index + 1}", "custom_id": custom_id, "response": None}
    return {"id": None, "line": line | {"error": {"code": code, "message": message}}}


async def ingest_batch(batch_id: str, content: bytes, endpoint: str, state) -> None:
    """Queue the input file's lines a chunk at a time (each line that cannot run becomes a line of the error
    file); a cancel or the end of the completion window stops it, the lines left then reported as such."""
    keys = state.queue.ops.keys
    lines = [line for line in content.decode(errors="replace").splitlines() if line.strip()]
    chunk = state.settings.batch_chunk
    try:
        for start in range(0, len(lines), chunk):
            stopped = await stop_reason(batch_id, state)
            if stopped is not None:
                await _skip(lines[start:], start, batch_id, stopped, state)
                await cancel_members(batch_id, state, expire=stopped == "expired")
                return
            part = lines[start : start + chunk]
            prepared = await asyncio.to_thread(
                lambda p=part, s=start: [_prepare(t, s + i, endpoint, state) for i, t in enumerate(p)]
            )
            await asyncio.gather(*(_submit(item, batch_id, state) for item in prepared))
            if start == 0:
                await _started(batch_id, state)
        stopped = await stop_reason(batch_id, state)
        if stopped is not None:  # lines queued while the cancel (or the window's end) was being read
            await cancel_members(batch_id, state, expire=stopped == "expired")
    except Exception as exc:  # a broken ingestion marks the batch failed instead of leaving it validating
        logger.exception("batch %s ingestion failed", batch_id)
        failed = {"status": "failed", "failed_at": int(time.time()), "errors": json.dumps(_errors(str(exc)))}
        await state.redis.hset(keys.batch(batch_id), mapping=failed)


def _errors(message: str) -> dict:
    """OpenAI's ``errors`` object of a batch that failed."""
    return {"object": "list", "data": [{"code": "ingestion_failed", "message": message, "param": None}]}


async def _started(batch_id: str, state) -> None:
    """validating -> in_progress (unless a cancel came first)."""
    ops = state.queue.ops
    await state.queue.run(ops.batch_status(batch_id, "in_progress", ("validating",), "in_progress_at"))


async def stop_reason(batch_id: str, state) -> str | None:
    """Why no more lines of the batch may be queued: "cancelled", "expired", or None."""
    key = state.queue.ops.keys.batch(batch_id)
    status, expires_at = await state.redis.hmget(key, ["status", "expires_at"])
    if text_of(status) == "cancelling":
        return "cancelled"
    if expires_at is not None and time.time() >= int(expires_at):
        return "expired"
    return None


SKIPPED = {  # why lines were never queued -> their error line's code and message
    "cancelled": ("batch_cancelled", "the batch was cancelled before this line started"),
    "expired": ("batch_expired", "this line could not start before the batch's completion window ended"),
}


async def _skip(lines: list[str], start: int, batch_id: str, reason: str, state) -> None:
    """Lines a cancel or the window's end stopped before they were queued: each a line of the error file."""
    code, message = SKIPPED[reason]
    for index, text in enumerate(lines, start):
        await _submit(_error_item(index, _custom_id(text, index), code, message), batch_id, state)


def _custom_id(text: str, index: int) -> str:
    try:
        return str(json.loads(text).get("custom_id", f"line-{index + 1}"))
    except (json.JSONDecodeError, AttributeError):
        return f"line-{index + 1}"


async def cancel_members(batch_id: str, state, expire: bool = False) -> None:
    """Cancel every queued line of the batch: a pending one ends at once (counted failed), a running one
    at its worker's next block boundary. ``expire``: end the pending ones only, as expired. Idempotent."""
    keys = state.queue.ops.keys
    members = await state.redis.lrange(keys.batch_members(batch_id), 0, -1)
    for request_id in as_text(members):
        await state.queue.run(state.queue.ops.cancel(request_id, 0, batch_id, expire=expire))


async def _submit(item, batch_id: str, state) -> None:
    keys = state.queue.ops.keys
    if isinstance(item, dict):
        results = keys.batch_results(batch_id)
        async with state.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(results, json.dumps(item))
            pipe.expire(results, state.settings.batch_ttl_s)
            pipe.hincrby(keys.batch(batch_id), "failed", 1)
            await pipe.execute()
        return
    item.meta[BATCH_META] = batch_id
    members = keys.batch_members(batch_id)
    async with state.redis.pipeline(transaction=True) as pipe:  # recorded first: a cancel then finds it
        pipe.rpush(members, item.id)
        pipe.expire(members, state.settings.batch_ttl_s)
        await pipe.execute()
    await state.queue.enqueue(item, max_queued=0)


def _response_body(done: DoneEvent, request_id: str, endpoint: str, state) -> dict:
    """The line's response as the endpoint answers it: text cut at the line's stop strings (its
    finish_reason then ``stop``), log probabilities where the line asked."""
    text, stopped = apply_stop(state.tokenizer.decode(done.token_ids), done.meta.get(STOP_META) or [])
    reason = finish_reason(done, stopped)  # error lines never get here (see output_lines)
    shown = tokens_shown(done, state.tokenizer, text, stopped)
    usage = {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": shown,
        "total_tokens": done.prompt_tokens + shown,
    }
    model = done.meta.get("model", state.settings.served_model)
    asked, cut = done.logprobs is not None, len(text) if stopped else None
    if endpoint == "/v1/chat/completions":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": reason,
            "logprobs": chat_logprobs(done, state.tokenizer, cut) if asked else None,
        }
        kind = "chat.completion"
    else:
        logprobs = completion_logprobs(done, state.tokenizer, text_len=cut) if asked else None
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
        kind = "text_completion"
    return {"id": request_id, "object": kind, "model": model, "choices": [choice], "usage": usage}


ENDED_EARLY = {  # a line's finish reason when it did not run to its end -> its error line's code, message
    "cancelled": ("batch_cancelled", "the batch was cancelled before this line finished"),
    "expired": SKIPPED["expired"],
    "error": ("invalid_request", "the request could not run"),
}


def result_lines(entries: list, endpoint: str, state) -> tuple[list[dict], list[dict]]:
    """The batch's results as the lines of its output file (answered lines) and of its error file (lines
    that could not run, were cancelled or expired), each keeping its ``custom_id``."""
    output, errors = [], []
    for raw in entries:
        entry = json.loads(raw)
        if entry.get("line") is not None:
            errors.append(entry["line"])
            continue
        done = decode_event(entry["done"])
        line = {"id": f"batch_req_{entry['id']}", "custom_id": done.meta.get("custom_id")}
        if done.error or done.finish_reason in ENDED_EARLY:
            code, message = ENDED_EARLY.get(done.finish_reason, ENDED_EARLY["error"])
            errors.append(
                line | {"response": None, "error": {"code": code, "message": done.error or message}}
            )
            continue
        body = _response_body(done, entry["id"], endpoint, state)
        response = {"status_code": 200, "request_id": entry["id"], "body": body}
        output.append(line | {"response": response, "error": None})
    return output, errors
