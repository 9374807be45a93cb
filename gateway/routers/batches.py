"""The batch API with OpenAI semantics: create a batch from an uploaded JSONL file, list, poll and
cancel batches, read their results (``<batch id>-output``, through the files API).

Every batch belongs to the tenant that created it, from one of its own files (see ``gateway.tenancy``).
Cancelling stops the lines not yet queued and cancels the queued ones (a running line stops at its next
block boundary); the batch is ``cancelling`` until every line is accounted for, then ``cancelled``.
"""

from __future__ import annotations

import json
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from engine_pod.queue.keys import is_request_id, new_request_id
from engine_pod.queue.ops import text_of
from gateway.batch_ingest import cancel_members, ingest_batch, output_lines
from gateway.errors import ApiError
from gateway.schemas import BatchCreate, BatchList, BatchObject, RequestCounts
from gateway.state import State, require_api_key
from gateway.tenancy import TENANT_FIELD, Tenant, add_to_index, owned, page

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
OUTPUT_SUFFIX = "-output"
CREATE_BATCH = "createBatch"  # the operation id of POST /v1/batches (the files API links to it)
ENDED = ("completed", "failed", "cancelled")


async def batch_output(state, batch: BatchObject) -> bytes:
    if batch.status not in ("completed", "cancelled"):
        raise ApiError(409, f"batch {batch.id} is {batch.status}; its output is ready when it has ended")
    entries = await state.redis.lrange(state.queue.ops.keys.batch_results(batch.id), 0, -1)
    return "".join(json.dumps(line) + "\n" for line in output_lines(entries, batch.endpoint, state)).encode()


@router.post("/batches", response_model=BatchObject, operation_id=CREATE_BATCH)
async def create_batch(body: BatchCreate, state: State, tenant: Tenant) -> BatchObject:
    keys = state.queue.ops.keys
    input_file = body.input_file_id
    found = (
        await state.redis.hmget(keys.file(input_file), ["content", TENANT_FIELD])
        if is_request_id(input_file, "file")
        else [None]
    )
    if found[0] is None:
        raise ApiError(404, f"no file {input_file!r}", param="input_file_id")
    owned(found[1], tenant, "file", input_file, "input_file_id")
    content = found[0]
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
        "input_file_id": input_file,
        "status": "validating",
        "created_at": int(time.time()),
        "total": 0,
        "completed": 0,
        "failed": 0,
        "metadata": json.dumps(body.metadata or {}),
        TENANT_FIELD: tenant,
    }
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.batch(batch_id), mapping=record)
        pipe.expire(keys.batch(batch_id), state.settings.batch_ttl_s)  # its results list inherits this
        await pipe.execute()
    await add_to_index(
        state, keys.batches_of(tenant), batch_id, record["created_at"], state.settings.batch_ttl_s
    )
    state.spawn(ingest_batch(batch_id, content, body.endpoint, state))
    return await owned_batch(state, tenant, batch_id)


async def _record(state, batch_id: str) -> dict[str, str] | None:
    if not is_request_id(batch_id, "batch"):
        return None
    raw = await state.redis.hgetall(state.queue.ops.keys.batch(batch_id))
    return {text_of(k): text_of(v) for k, v in raw.items()} if raw else None


async def owned_batch(state, tenant: str, batch_id: str) -> BatchObject:
    """The tenant's batch (404 when it does not exist or is another tenant's), its status brought up to
    date: ``in_progress`` or ``cancelling`` with every line accounted for has ended."""
    data = await _record(state, batch_id)
    if data is None:
        raise ApiError(404, f"no batch {batch_id!r}", param="batch_id")
    owned(data.get(TENANT_FIELD), tenant, "batch", batch_id, "batch_id")
    counts = RequestCounts(
        total=int(data["total"]), completed=int(data["completed"]), failed=int(data["failed"])
    )
    status = data["status"]
    if status in ("in_progress", "cancelling") and counts.completed + counts.failed >= counts.total:
        status = "completed" if status == "in_progress" else "cancelled"
        field = "completed_at" if status == "completed" else "cancelled_at"
        if field not in data:
            data[field] = str(int(time.time()))
            await state.redis.hsetnx(state.queue.ops.keys.batch(batch_id), field, data[field])
    return BatchObject(
        id=batch_id,
        endpoint=data["endpoint"],
        input_file_id=data["input_file_id"],
        status=status,
        output_file_id=batch_id + OUTPUT_SUFFIX if status in ("completed", "cancelled") else None,
        created_at=int(data["created_at"]),
        completed_at=int(data["completed_at"]) if status == "completed" else None,
        cancelling_at=int(data["cancelling_at"]) if "cancelling_at" in data else None,
        cancelled_at=int(data["cancelled_at"]) if status == "cancelled" else None,
        request_counts=counts,
        errors=json.loads(data["errors"]) if data.get("errors") else None,
        metadata=json.loads(data.get("metadata") or "{}") or None,
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
    if batch.status in ENDED:
        raise ApiError(409, f"batch {batch_id} is {batch.status}; only a running batch can be cancelled")
    key = state.queue.ops.keys.batch(batch_id)
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, "status", "cancelling")
        pipe.hsetnx(key, "cancelling_at", int(time.time()))
        await pipe.execute()
    await cancel_members(batch_id, state)  # ingestion, should it still run, stops at its next chunk
    return await owned_batch(state, tenant, batch_id)
