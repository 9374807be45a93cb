"""The files API with OpenAI semantics: upload (JSONL for batches), list, retrieve, content, delete.

A batch's output and error files are files too (purpose ``batch_output``), written when the batch ends.
Every file belongs to the tenant that uploaded it or whose batch wrote it (see ``gateway.tenancy``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Query, UploadFile
from fastapi.responses import Response

from dllm_contracts.queue.keys import is_request_id
from dllm_contracts.queue.ops import text_of
from gateway.errors import ApiError
from gateway.routers.batches import CREATE_BATCH
from gateway.schemas import FileDeleted, FileList, FileObject
from gateway.state import State, require_api_key
from gateway.stored_files import META_FIELDS, store_file
from gateway.tenancy import Tenant, belongs, page

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


# A link in the OpenAPI document: the uploaded file's id feeds a batch (what stateful clients, and the
# stateful fuzzing in tests, follow).
_CREATES_BATCH = {
    "links": {
        "CreateBatch": {"operationId": CREATE_BATCH, "requestBody": {"input_file_id": "$response.body#/id"}}
    }
}


@router.post("/files", response_model=FileObject, responses={200: _CREATES_BATCH})
async def upload_file(
    state: State,
    tenant: Tenant,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form(json_schema_extra={"enum": ["batch"]})],
) -> FileObject:
    if purpose != "batch":
        raise ApiError(
            400, f"purpose {purpose!r} is not supported; use 'batch'", param="purpose", code="invalid_value"
        )
    content = await file.read()
    if not content.strip():
        raise ApiError(400, "the file is empty", param="file", code="invalid_value")
    return await store_file(state, tenant, file.filename or "upload.jsonl", purpose, content)


async def owned_file(state, tenant: str, file_id: str) -> FileObject | None:
    """The tenant's file ``file_id`` (None when it does not exist or is another tenant's)."""
    if not is_request_id(file_id, "file"):
        return None
    values = await state.redis.hmget(state.queue.ops.keys.file(file_id), META_FIELDS)
    if values[0] is None or not belongs(values[4], tenant):
        return None
    return FileObject(
        id=file_id,
        filename=text_of(values[0]),
        bytes=int(values[1]),
        created_at=int(values[2]),
        purpose=text_of(values[3]),
        expires_at=int(values[5]) if values[5] is not None else None,  # (files stored before it was kept)
    )


async def _file(state, tenant: str, file_id: str) -> FileObject:
    found = await owned_file(state, tenant, file_id)
    if found is None:
        raise ApiError(404, f"no file {file_id!r}", param="file_id")
    return found


@router.get("/files", response_model=FileList)
async def list_files(
    state: State,
    tenant: Tenant,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> FileList:
    ids, has_more = await page(state, state.queue.ops.keys.files_of(tenant), after, limit, order == "desc")
    files = [f for f in [await owned_file(state, tenant, i) for i in ids] if f is not None]
    files = [f for f in files if purpose is None or f.purpose == purpose]
    return FileList.of(files, has_more)


@router.get("/files/{file_id}", response_model=FileObject)
async def get_file(file_id: str, state: State, tenant: Tenant) -> FileObject:
    return await _file(state, tenant, file_id)


@router.get("/files/{file_id}/content")
async def file_content(file_id: str, state: State, tenant: Tenant) -> Response:
    await _file(state, tenant, file_id)
    content = await state.redis.hget(state.queue.ops.keys.file(file_id), "content")
    if content is None:
        raise ApiError(404, f"no file {file_id!r}", param="file_id")
    return Response(content, media_type="application/jsonl")


@router.delete("/files/{file_id}", response_model=FileDeleted)
async def delete_file(file_id: str, state: State, tenant: Tenant) -> FileDeleted:
    await _file(state, tenant, file_id)
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.delete(state.queue.ops.keys.file(file_id))
        pipe.zrem(state.queue.ops.keys.files_of(tenant), file_id)
        await pipe.execute()
    return FileDeleted(id=file_id)
