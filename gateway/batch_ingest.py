"""Batch ingestion: a batch's input lines queued in the batch lane a chunk at a time, from the cursor its
record keeps (tokenised off the event loop). Each chunk is queued and the cursor moved in one atomic step,
only while this gateway holds the batch's lease (``batch_scripts.INGEST``), so an ingestion that stops anywhere
is resumed by whichever gateway takes the batch over, and no line is skipped or queued twice."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time

from pydantic import ValidationError

from dllm_contracts.queue.messages import BATCH_META, QueuedRequest
from dllm_contracts.queue.ops import IngestChunk, as_text, text_of
from gateway.chat_answers import TOOLS_META, answers_with_calls, tools_for_prompt
from gateway.errors import ApiError, validation_error
from gateway.input_lines import given_custom_id, iter_lines
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.stored_files import open_file
from gateway.submission import build_request, check_prompt_text, check_request, request_params
from gateway.tokenizer import TokenizerError

logger = logging.getLogger(__name__)
_BODY = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}
STOP_META = "stop"  # the meta entry holding a line's stop strings (applied when its output is read)
LINE_META = "line"  # the meta entry holding a line's index in the input file (orders the output)
MODEL_FIELD = "model_identity"  # the batch's hash field: the model identity its lines are stamped with


class LeaseLost(Exception):
    """Another gateway holds the batch now (this one's lease expired): it ingests from the cursor."""


def _prepare(line_text: str, index: int, endpoint: str, model: str | None, state) -> QueuedRequest | dict:
    """A queued request for one input line (for the model the batch was created on: ``model``), or the
    error line to report instead."""
    custom_id = f"line-{index + 1}"
    try:
        line = json.loads(line_text)
        if not isinstance(line, dict):
            raise ApiError(400, "the line is not a JSON object")
        custom_id = str(line.get("custom_id", custom_id))
        if line.get("url", endpoint) != endpoint:
            raise ApiError(
                400, f"url {line.get('url')!r} differs from the batch endpoint {endpoint!r}", param="url"
            )
        body = _BODY[endpoint].model_validate(line.get("body") or {})
        if body.stream:
            raise ApiError(400, "stream is not allowed in a batch", param="stream")
        if body.n > 1:
            raise ApiError(400, "a batch line takes n=1", param="n")
        if getattr(body, "echo", False):
            raise ApiError(400, "echo is not supported in a batch line", param="echo")
        check_request(body, state)
        params = request_params(body, state)
        ids = _prompt_ids(body, state)
        meta = {"custom_id": custom_id, "model": body.model, LINE_META: index}
        if body.stop_strings():
            meta[STOP_META] = body.stop_strings()
        if answers_with_calls(body):
            meta[TOOLS_META] = True
        return build_request(ids, body, state, params, meta=meta, model_identity=model)
    except ValidationError as exc:  # the field and what is wrong with it; the code as for any bad line
        problem = validation_error(exc.errors())
        return _error_item(index, custom_id, ApiError(400, problem.message, param=problem.param))
    except (ApiError, TokenizerError) as exc:
        return _error_item(index, custom_id, exc if isinstance(exc, ApiError) else ApiError(400, str(exc)))
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested deeper than Python parses
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        return _error_item(index, custom_id, ApiError(400, f"the line is not valid JSON ({reason})"))


def _prompt_ids(body, state) -> list[int]:
    """A line's one prompt as token ids (a chat's messages rendered by the chat template)."""
    if hasattr(body, "messages"):
        messages = [message.for_template() for message in body.messages]
        check_prompt_text([m["content"] for m in messages], state, "messages")
        return state.tokenizer.encode_chat(messages, tools_for_prompt(body))
    if isinstance(body.prompt, str):
        check_prompt_text([body.prompt], state)
        return state.tokenizer.encode(body.prompt)
    if body.prompt and isinstance(body.prompt[0], int):
        return list(body.prompt)
    raise ApiError(400, "a batch completion line takes one prompt: a string or a list of token ids")


def _error_item(index: int, custom_id: str, problem: ApiError) -> dict:
    """A line that could not run, as its line of the error file (with its index in the input file): its
    error names the line (from 1) and, where one field is wrong, the field (``body.messages``), as OpenAI's
    batch errors do."""
    number = index + 1
    param = None if problem.param is None else f"{'' if problem.param == 'url' else 'body.'}{problem.param}"
    error = {"code": problem.code or "invalid_request", "message": f"line {number}: {problem.message}"}
    error |= {"param": param, "line": number}
    return _error_line(index, custom_id, error)


def _error_line(index: int, custom_id: str, error: dict) -> dict:
    line = {"id": f"batch_req_line{index + 1}", "custom_id": custom_id, "response": None}
    return {"index": index, "line": line | {"error": error}}


SKIPPED = {  # why lines were never queued -> their error line's code and message
    "cancelled": ("batch_cancelled", "the batch was cancelled before this line started"),
    "expired": ("batch_expired", "this line could not start before the batch's completion window ended"),
}


def _skipped(text: str, index: int, reason: str) -> dict:
    """A line a cancel or the window's end stopped before it was queued."""
    code, message = SKIPPED[reason]
    return _error_line(index, _custom_id(text, index), {"code": code, "message": message})


def _custom_id(text: str, index: int) -> str:
    given = given_custom_id(text)
    return f"line-{index + 1}" if given is None else given


async def ingest_batch(batch_id: str, gateway: str, state) -> None:
    """Queue the batch's input lines from its cursor on, a chunk at a time (each line that cannot run
    becomes a line of the error file); a cancel or the end of the completion window stops it, the lines
    left then reported as such. Raises ``LeaseLost`` when another gateway holds the batch now."""
    keys = state.queue.ops.keys
    fields = ["endpoint", "input_file_id", "cursor", "total", MODEL_FIELD]
    endpoint, input_file, cursor, total, model = map(
        text_of, await state.redis.hmget(keys.batch(batch_id), fields)
    )
    if endpoint is None:
        return  # the batch is gone (past its retention)
    start, stopped = int(cursor or 0), None
    if start < int(total):
        reader = await _input_of(input_file, state)
        try:
            stopped = await _ingest_lines(batch_id, gateway, (endpoint, model), reader, start, state)
        finally:
            await asyncio.to_thread(reader.close)
    stopped = stopped or await stop_reason(batch_id, state)
    if stopped is not None:  # lines queued while the cancel (or the window's end) was being read
        await cancel_members(batch_id, state, expire=stopped == "expired")


async def _ingest_lines(batch_id: str, gateway: str, target, reader, start: int, state) -> str | None:
    """Queue the input's lines from ``start`` on, ``batch_chunk`` at a time, as they are read from the
    store; why it stopped early ("cancelled", "expired") or None."""
    endpoint, model = target
    lines, chunk, stopped = iter_lines(reader), state.settings.batch_chunk, None
    await asyncio.to_thread(lambda: next(itertools.islice(lines, start, start), None))  # the lines taken in
    part = await asyncio.to_thread(_take, lines, chunk)
    while part:
        stopped = await stop_reason(batch_id, state)
        if stopped is not None:
            items = [_skipped(text, start + i, stopped) for i, text in enumerate(part)]
        else:
            items = await asyncio.to_thread(
                lambda p=part, s=start: [_prepare(t, s + i, endpoint, model, state) for i, t in enumerate(p)]
            )
        where = IngestChunk(gateway, start, start + len(part), [], [])
        reply = await _queue_chunk(batch_id, where, items, state)
        if reply == 0:
            raise LeaseLost(batch_id)
        if reply == -1:
            return None
        if reply == 1:  # (2: a cancel came first; the next round reports the chunk's lines cancelled)
            start += len(part)
            await _started(batch_id, state)
            part = await asyncio.to_thread(_take, lines, chunk)
    return stopped


def _take(lines, count: int) -> list[str]:
    return list(itertools.islice(lines, count))


async def _input_of(input_file: str, state):
    try:
        return await open_file(state, input_file)
    except FileNotFoundError:
        raise ValueError(f"the input file {input_file} was deleted before its lines were queued") from None


async def _queue_chunk(batch_id: str, empty: IngestChunk, items: list, state) -> int:
    """INGEST's reply for one chunk of prepared lines (requests and error lines)."""
    requests = [item for item in items if isinstance(item, QueuedRequest)]
    for request in requests:
        request.meta[BATCH_META] = batch_id
    errors = [(f"line:{item['index']}", json.dumps(item)) for item in items if isinstance(item, dict)]
    chunk = IngestChunk(empty.gateway, empty.start, empty.end, requests, errors)
    return int(await state.queue.run(state.queue.ops.ingest(batch_id, chunk, state.settings.batch_ttl_s)))


def mark_failed(message: str) -> dict:
    """The fields of a batch whose ingestion broke (OpenAI's ``errors`` object)."""
    errors = {"object": "list", "data": [{"code": "ingestion_failed", "message": message, "param": None}]}
    return {"status": "failed", "failed_at": int(time.time()), "errors": json.dumps(errors)}


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


async def cancel_members(batch_id: str, state, expire: bool = False) -> None:
    """Cancel every queued line of the batch: a pending one ends at once (counted failed), a running one
    at its worker's next block boundary. ``expire``: end the pending ones only, as expired. Idempotent."""
    keys = state.queue.ops.keys
    members = await state.redis.lrange(keys.batch_members(batch_id), 0, -1)
    for request_id in as_text(members):
        await state.queue.run(state.queue.ops.cancel(request_id, 0, batch_id, expire=expire))
