"""Batch ingestion in the background (chunked, tokenised off the event loop) and output rendering."""

from __future__ import annotations

import asyncio
import json
import logging

from pydantic import ValidationError

from engine_pod.queue.messages import BATCH_META, DoneEvent, decode_event
from engine_pod.queue.ops import as_text, text_of
from gateway.errors import ApiError
from gateway.logprobs import chat_logprobs, completion_logprobs
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.submission import apply_stop, build_request, check_decoding_fields, finish_reason
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
        check_decoding_fields(body, state)
        if endpoint == "/v1/chat/completions":
            ids = state.tokenizer.encode_chat(
                [m.model_dump(include={"role", "content"}) for m in body.messages]
            )
        elif isinstance(body.prompt, str):
            ids = state.tokenizer.encode(body.prompt)
        else:
            raise ApiError(400, "batch completion lines take a single string prompt")
        meta = {"custom_id": custom_id, "model": body.model}
        if body.stop_strings():
            meta[STOP_META] = body.stop_strings()
        return build_request(ids, body, state, meta=meta)
    except (json.JSONDecodeError, ValidationError, ApiError, TokenizerError, AttributeError) as exc:
        message = exc.message if isinstance(exc, ApiError) else str(exc).splitlines()[0]
        return {
            "id": None,
            "line": {
                "id": f"batch_req_line{index + 1}",
                "custom_id": custom_id,
                "response": None,
                "error": {"code": "invalid_request", "message": message},
            },
        }


async def ingest_batch(batch_id: str, content: bytes, endpoint: str, state) -> None:
    keys = state.queue.ops.keys
    lines = [line for line in content.decode(errors="replace").splitlines() if line.strip()]
    await state.redis.hset(keys.batch(batch_id), "total", len(lines))
    chunk = state.settings.batch_chunk
    try:
        for start in range(0, len(lines), chunk):
            if await _cancelled(batch_id, state):
                await _skip(lines[start:], start, batch_id, state)
                await cancel_members(batch_id, state)  # also those queued while the cancel was read
                return
            part = lines[start : start + chunk]
            prepared = await asyncio.to_thread(
                lambda p=part, s=start: [_prepare(t, s + i, endpoint, state) for i, t in enumerate(p)]
            )
            await asyncio.gather(*(_submit(item, batch_id, state) for item in prepared))
            await asyncio.sleep(0)
    except Exception as exc:  # a broken ingestion marks the batch failed instead of leaving it validating
        logger.exception("batch %s ingestion failed", batch_id)
        await state.redis.hset(
            keys.batch(batch_id), mapping={"status": "failed", "errors": json.dumps({"message": str(exc)})}
        )
        return
    if not await _cancelled(batch_id, state):
        await state.redis.hset(keys.batch(batch_id), "status", "in_progress")
    else:
        await cancel_members(batch_id, state)


async def _cancelled(batch_id: str, state) -> bool:
    status = await state.redis.hget(state.queue.ops.keys.batch(batch_id), "status")
    return text_of(status) == "cancelling"


async def _skip(lines: list[str], start: int, batch_id: str, state) -> None:
    """Lines a cancel stopped before they were queued: each an error line of the output."""
    for index, text in enumerate(lines, start):
        line = {"id": f"batch_req_line{index + 1}", "custom_id": _custom_id(text, index), "response": None}
        await _submit(
            {"id": None, "line": line | {"error": {"code": "cancelled", "message": "batch cancelled"}}},
            batch_id,
            state,
        )


def _custom_id(text: str, index: int) -> str:
    try:
        return str(json.loads(text).get("custom_id", f"line-{index + 1}"))
    except (json.JSONDecodeError, AttributeError):
        return f"line-{index + 1}"


async def cancel_members(batch_id: str, state) -> None:
    """Cancel every queued line of the batch: a pending one ends at once (counted failed), a running one
    at its worker's next block boundary. Idempotent."""
    keys = state.queue.ops.keys
    members = await state.redis.lrange(keys.batch_members(batch_id), 0, -1)
    for request_id in as_text(members):
        await state.queue.run(state.queue.ops.cancel(request_id, 0, batch_id))


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
    usage = {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
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


def output_lines(entries: list, endpoint: str, state) -> list[dict]:
    lines = []
    for raw in entries:
        entry = json.loads(raw)
        if entry.get("line") is not None:
            lines.append(entry["line"])
            continue
        done = decode_event(entry["done"])
        custom_id = done.meta.get("custom_id")
        if done.error or done.finish_reason in ("error", "cancelled"):
            error = {"code": done.finish_reason, "message": done.error or "cancelled"}
            lines.append(
                {"id": f"batch_req_{entry['id']}", "custom_id": custom_id, "response": None, "error": error}
            )
            continue
        body = _response_body(done, entry["id"], endpoint, state)
        response = {"status_code": 200, "request_id": entry["id"], "body": body}
        lines.append(
            {"id": f"batch_req_{entry['id']}", "custom_id": custom_id, "response": response, "error": None}
        )
    return lines
