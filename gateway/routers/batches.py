"""The batch API with OpenAI semantics: create a batch from an uploaded JSONL file, list, poll and
cancel batches; their results are files (``output_file_id``: answered lines, ``error_file_id``: lines that
failed, were cancelled or expired), read through the files API.

Every batch belongs to the tenant that created it, from one of its own files (see ``gateway.tenancy``).
A batch is ``validating`` until its first lines are queued, ``in_progress`` until every line is accounted
for, ``finalizing`` while its files are written, then ``completed``. Cancelling stops the lines not yet
queued and cancels the queued ones (a running line stops at its next block boundary): ``cancelling``, then
``cancelled``. Lines that have not started when the completion window closes end as expired, and the
batch as ``expired`` (see ``gateway.batch_lifecycle``).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from dllm_contracts.queue.keys import is_batch_id, is_request_id, new_batch_id
from dllm_contracts.queue.ops import now_ms
from gateway.batch_ingest import MODEL_FIELD, cancel_members
from gateway.batch_keeper import LEASE_MS
from gateway.batch_lifecycle import ENDED, advance, read_record
from gateway.batch_lines import reserve_batch_lines
from gateway.errors import ApiError
from gateway.input_lines import count_lines
from gateway.schemas import BatchCreate, BatchList, BatchObject, RequestCounts
from gateway.state import State, require_api_key
from gateway.stored_files import open_file
from gateway.tenancy import TENANT_FIELD, CurrentCaller, Tenant, add_to_index, owned, page

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
CREATE_BATCH = "createBatch"  # the operation id of POST /v1/batches (the files API links to it)
TIMES = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at")
TIMES += ("cancelling_at", "cancelled_at")


@router.post("/batches", response_model=BatchObject, operation_id=CREATE_BATCH)
async def create_batch(body: BatchCreate, state: State, caller: CurrentCaller) -> BatchObject:
    tenant = caller.tenant
    keys = state.queue.ops.keys
    input_file = body.input_file_id
    found = (
        await state.redis.hmget(keys.file(input_file), ["bytes", TENANT_FIELD])
        if is_request_id(input_file, "file")
        else [None]
    )
    if found[0] is None:
        raise ApiError(404, f"no file {input_file!r}", param="input_file_id")
    owned(found[1], tenant, "file", input_file, "input_file_id")
    try:
        reader = await open_file(state, input_file)
    except FileNotFoundError:
        raise ApiError(404, f"no file {input_file!r}", param="input_file_id") from None
    try:
        lines = await asyncio.to_thread(_checked_lines, reader, state.settings.max_batch_lines)
    finally:
        await asyncio.to_thread(reader.close)
    batch_id, now = new_batch_id(), int(time.time())
    await reserve_batch_lines(state, caller, batch_id, lines)
    record = {
        "endpoint": body.endpoint,
        "input_file_id": input_file,
        "status": "validating",
        "created_at": now,
        "expires_at": now + state.settings.batch_window_s,
        "total": lines,
        "completed": 0,
        "failed": 0,
        "metadata": json.dumps(body.metadata or {}),
        TENANT_FIELD: tenant,
        "cursor": 0,  # input lines taken in (queued, or recorded as error lines)
        "owner": state.batches.gateway,  # the gateway holding its lease (see gateway.batch_keeper)
        MODEL_FIELD: state.settings.model_identity,  # its lines run on this model, whoever ingests them
    }
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.batch(batch_id), mapping=record)
        pipe.expire(keys.batch(batch_id), state.settings.batch_ttl_s)  # its results inherit this
        pipe.zadd(keys.batch_leases, {batch_id: now_ms() + LEASE_MS})
        await pipe.execute()
    await add_to_index(
        state, keys.batches_of(tenant), batch_id, record["created_at"], state.settings.batch_ttl_s
    )
    state.batches.adopt(batch_id)
    return await owned_batch(state, tenant, batch_id)


def _checked_lines(reader, limit: int) -> int:
    """The number of request lines in a batch's input file (read from the store as a stream); a 400 when
    there are more than ``limit`` or two share a ``custom_id`` (their results could not be told apart), as
    OpenAI refuses such a file."""
    lines, duplicate = count_lines(reader, limit)
    if lines > limit:
        raise ApiError(
            400,
            f"the input file has {lines} requests; a batch takes at most {limit}",
            param="input_file_id",
        )
    if duplicate is not None:
        custom_id, first, second = duplicate
        raise ApiError(
            400,
            f"the input file's lines {first} and {second} have the same custom_id {custom_id!r}; "
            "each request's custom_id must be unique in a batch",
            param="input_file_id",
            code="duplicate_custom_id",
        )
    return lines


async def owned_batch(state, tenant: str, batch_id: str) -> BatchObject:
    """The tenant's batch (404 when it does not exist or is another tenant's), moved on as far as it can
    go now (see ``gateway.batch_lifecycle.advance``)."""
    data = await read_record(state, batch_id) if is_batch_id(batch_id) else None
    if data is None:
        raise ApiError(404, f"no batch {batch_id!r}", param="batch_id")
    owned(data.get(TENANT_FIELD), tenant, "batch", batch_id, "batch_id")
    data = await advance(state, batch_id, data)
    counts = RequestCounts(
        total=int(data["total"]), completed=int(data["completed"]), failed=int(data["failed"])
    )
    return BatchObject(
        id=batch_id,
        endpoint=data["endpoint"],
        input_file_id=data["input_file_id"],
        status=data["status"],
        output_file_id=data.get("output_file_id"),
        error_file_id=data.get("error_file_id"),
        created_at=int(data["created_at"]),
        expires_at=int(data["expires_at"]),
        request_counts=counts,
        errors=json.loads(data["errors"]) if data.get("errors") else None,
        metadata=json.loads(data.get("metadata") or "{}") or None,
        **{field: int(data[field]) for field in TIMES if field in data},
    )


@router.get("/batches", response_model=BatchList)
async def list_batches(
    state: State, tenant: Tenant, after: str | None = None, limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> BatchList:
    ids, has_more = await page(state, state.queue.ops.keys.batches_of(tenant), after, limit)
    batches = []
    for batch_id in ids:
        try:
            batches.append(await owned_batch(state, tenant, batch_id))
        except ApiError:  # expired since it was listed
            continue
    return BatchList.of(batches, has_more)


@router.get("/batches/{batch_id}", response_model=BatchObject)
async def get_batch(batch_id: str, state: State, tenant: Tenant) -> BatchObject:
    return await owned_batch(state, tenant, batch_id)


@router.post("/batches/{batch_id}/cancel", response_model=BatchObject)
async def cancel_batch(batch_id: str, state: State, tenant: Tenant) -> BatchObject:
    batch = await owned_batch(state, tenant, batch_id)
    if batch.status in ("cancelling", "cancelled"):
        return batch
    if batch.status in (*ENDED, "finalizing"):
        raise ApiError(409, f"batch {batch_id} is {batch.status}; only a running batch can be cancelled")
    running = ("validating", "in_progress")
    if not await state.queue.run(
        state.queue.ops.batch_status(batch_id, "cancelling", running, "cancelling_at")
    ):
        return await cancel_batch(batch_id, state, tenant)  # it moved on meanwhile: answer for where it is
    await cancel_members(batch_id, state)  # ingestion, should it still run, stops at its next chunk
    return await owned_batch(state, tenant, batch_id)
