"""The batch API with OpenAI semantics: upload a JSONL file, create a batch, poll it, read its results."""

from __future__ import annotations

import json
import time
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, UploadFile
from fastapi.responses import Response

from engine_pod.queue.keys import is_request_id, new_request_id
from gateway.batch_ingest import ingest_batch, output_lines
from gateway.errors import ApiError
from gateway.schemas import BatchCreate, BatchObject, FileObject, RequestCounts
from gateway.state import State, require_api_key

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
MAX_FILE_BYTES = 200 * 1024 * 1024
OUTPUT_SUFFIX = "-output"


def _known_form(identifier: str, prefix: str, param: str) -> str:
    """``identifier`` if it has the form of an id we issue; else 404 before it reaches a Redis key (an id
    such as ``<batch>:results`` would name another key)."""
    if not is_request_id(identifier, prefix):
        raise ApiError(404, f"no {prefix} {identifier!r}", param=param)
    return identifier


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@router.post("/files", response_model=FileObject)
async def upload_file(
    state: State, file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]
) -> FileObject:
    if purpose != "batch":
        raise ApiError(400, f"purpose {purpose!r} is not supported; use 'batch'", param="purpose")
    content = await file.read()
    if len(content) > MAX_FILE_BYTES:
        raise ApiError(413, f"file is {len(content)} bytes; the limit is {MAX_FILE_BYTES}", param="file")
    if not content.strip():
        raise ApiError(400, "the file is empty", param="file")
    file_id = new_request_id("file")
    meta = {
        "filename": file.filename or "upload.jsonl",
        "bytes": len(content),
        "created_at": int(time.time()),
        "purpose": purpose,
    }
    key = state.queue.ops.keys.file(file_id)
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=meta | {"content": content})
        pipe.expire(key, state.settings.file_ttl_s)
        await pipe.execute()
    return FileObject(id=file_id, **meta)


async def _file_meta(state, file_id: str) -> dict:
    _known_form(file_id, "file", "file_id")
    values = await state.redis.hmget(
        state.queue.ops.keys.file(file_id), ["filename", "bytes", "created_at", "purpose"]
    )
    if values[0] is None:
        raise ApiError(404, f"no file {file_id!r}", param="file_id")
    return {
        "filename": _text(values[0]),
        "bytes": int(values[1]),
        "created_at": int(values[2]),
        "purpose": _text(values[3]),
    }


@router.get("/files/{file_id}", response_model=FileObject)
async def get_file(file_id: str, state: State) -> FileObject:
    if file_id.endswith(OUTPUT_SUFFIX):
        batch = await _batch(state, file_id[: -len(OUTPUT_SUFFIX)])
        content = await _output(state, batch)
        return FileObject(
            id=file_id,
            bytes=len(content),
            created_at=batch.created_at,
            filename=f"{batch.id}_output.jsonl",
            purpose="batch_output",
        )
    return FileObject(id=file_id, **await _file_meta(state, file_id))


@router.get("/files/{file_id}/content")
async def file_content(file_id: str, state: State) -> Response:
    if file_id.endswith(OUTPUT_SUFFIX):
        batch = await _batch(state, file_id[: -len(OUTPUT_SUFFIX)])
        return Response(await _output(state, batch), media_type="application/jsonl")
    content = await state.redis.hget(
        state.queue.ops.keys.file(_known_form(file_id, "file", "file_id")), "content"
    )
    if content is None:
        raise ApiError(404, f"no file {file_id!r}", param="file_id")
    return Response(content, media_type="application/jsonl")


async def _output(state, batch: BatchObject) -> bytes:
    if batch.status != "completed":
        raise ApiError(409, f"batch {batch.id} is {batch.status}; its output is ready when it is completed")
    entries = await state.redis.lrange(state.queue.ops.keys.batch_results(batch.id), 0, -1)
    return "".join(json.dumps(line) + "\n" for line in output_lines(entries, batch.endpoint, state)).encode()


@router.post("/batches", response_model=BatchObject)
async def create_batch(body: BatchCreate, state: State) -> BatchObject:
    input_file = _known_form(body.input_file_id, "file", "input_file_id")
    content = await state.redis.hget(state.queue.ops.keys.file(input_file), "content")
    if content is None:
        raise ApiError(404, f"no file {body.input_file_id!r}", param="input_file_id")
    lines = sum(1 for line in content.splitlines() if line.strip())
    if lines > state.settings.max_batch_lines:
        raise ApiError(
            400,
            f"the input file has {lines} requests; a batch takes at most {state.settings.max_batch_lines}",
            param="input_file_id",
        )
    batch_id = new_request_id("batch")
    record = {
        "endpoint": body.endpoint,
        "input_file_id": body.input_file_id,
        "status": "validating",
        "created_at": int(time.time()),
        "total": 0,
        "completed": 0,
        "failed": 0,
        "metadata": json.dumps(body.metadata or {}),
    }
    key = state.queue.ops.keys.batch(batch_id)
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=record)
        pipe.expire(key, state.settings.batch_ttl_s)  # its results list inherits this (queue scripts)
        await pipe.execute()
    state.spawn(ingest_batch(batch_id, content, body.endpoint, state))
    return await _batch(state, batch_id)


async def _batch(state, batch_id: str) -> BatchObject:
    _known_form(batch_id, "batch", "batch_id")
    raw = await state.redis.hgetall(state.queue.ops.keys.batch(batch_id))
    if not raw:
        raise ApiError(404, f"no batch {batch_id!r}", param="batch_id")
    data = {_text(k): _text(v) for k, v in raw.items()}
    counts = RequestCounts(
        total=int(data["total"]), completed=int(data["completed"]), failed=int(data["failed"])
    )
    status = data["status"]
    done = status == "in_progress" and counts.completed + counts.failed >= counts.total
    if done:
        status = "completed"
        if "completed_at" not in data:
            data["completed_at"] = str(int(time.time()))
            await state.redis.hsetnx(
                state.queue.ops.keys.batch(batch_id), "completed_at", data["completed_at"]
            )
    return BatchObject(
        id=batch_id,
        endpoint=data["endpoint"],
        input_file_id=data["input_file_id"],
        status=status,
        output_file_id=batch_id + OUTPUT_SUFFIX if status == "completed" else None,
        created_at=int(data["created_at"]),
        completed_at=int(data["completed_at"]) if done else None,
        request_counts=counts,
        errors=json.loads(data["errors"]) if data.get("errors") else None,
        metadata=json.loads(data.get("metadata") or "{}") or None,
    )


@router.get("/batches/{batch_id}", response_model=BatchObject)
async def get_batch(batch_id: str, state: State) -> BatchObject:
    return await _batch(state, batch_id)
