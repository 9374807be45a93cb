"""The files API with OpenAI semantics: upload (JSONL for batches), list, retrieve, content, delete.
Uploads and downloads are streamed (the bytes live in the file store, see ``gateway.stored_files``); a
tenant's files together may not pass its key's storage limit (``storage=`` on its line of the keys file,
else ``storage_quota_bytes``), checked by every gateway against the same count in Redis.

A batch's output and error files are files too (purpose ``batch_output``), written when the batch ends.
Every file belongs to the tenant that uploaded it or whose batch wrote it (see ``gateway.tenancy``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from dllm_contracts.queue.keys import is_request_id
from dllm_contracts.queue.ops import text_of
from gateway.errors import ApiError
from gateway.multipart_upload import FILE_FIELD, MultipartUpload
from gateway.routers.batches import CREATE_BATCH
from gateway.schemas import FileDeleted, FileList, FileObject
from gateway.state import State, require_api_key
from gateway.stored_files import META_FIELDS, file_chunks, open_file, over_quota, storage_used, write_file
from gateway.stored_files import delete_file as drop_file
from gateway.tenancy import CurrentCaller, Tenant, belongs, page

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


# A link in the OpenAPI document: the uploaded file's id feeds a batch (what stateful clients, and the
# stateful fuzzing in tests, follow).
_CREATES_BATCH = {
    "links": {
        "CreateBatch": {"operationId": CREATE_BATCH, "requestBody": {"input_file_id": "$response.body#/id"}}
    }
}


UPLOAD_BODY = {  # the form the upload reads as it arrives (gateway.multipart_upload), as OpenAI takes it
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": [FILE_FIELD, "purpose"],
                    "properties": {
                        FILE_FIELD: {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}
FORM_SLACK = 64 * 1024  # a declared body this much over the quota's room is refused unread (form overhead)


@router.post("/files", response_model=FileObject, responses={200: _CREATES_BATCH}, openapi_extra=UPLOAD_BODY)
async def upload_file(request: Request, state: State, caller: CurrentCaller) -> FileObject:
    """The file's bytes go to the file store as they arrive; its record is written once they are all in
    (see ``gateway.stored_files``)."""
    upload = MultipartUpload(request)
    tenant, quota = caller.tenant, caller.limits.storage
    room = await _room(state, tenant, quota, request.headers.get("content-length", ""))
    seen = {"bytes": 0, "text": False}

    async def checked():
        async for chunk in upload.file_chunks():
            _check_purpose(upload.fields.get("purpose"))
            seen["bytes"] += len(chunk)
            seen["text"] = seen["text"] or bool(chunk.strip())
            if room is not None and seen["bytes"] > room:
                raise over_quota(state, await storage_used(state, tenant), quota)
            yield chunk

    def describe() -> tuple[str, str]:
        purpose = upload.fields.get("purpose")
        if purpose is None:
            raise ApiError(400, "the upload has no purpose (use 'batch')", param="purpose")
        _check_purpose(purpose)
        if not seen["text"]:
            raise ApiError(400, "the file is empty", param="file", code="invalid_value")
        return upload.filename or "upload.jsonl", purpose

    try:
        async with asyncio.timeout(state.settings.max_upload_s):
            return await write_file(state, tenant, checked(), describe, quota=quota)
    except TimeoutError:
        raise ApiError(408, "the upload took too long; send it again", code="upload_timeout") from None


def _check_purpose(purpose: str | None) -> None:
    if purpose is not None and purpose != "batch":
        raise ApiError(
            400, f"purpose {purpose!r} is not supported; use 'batch'", param="purpose", code="invalid_value"
        )


async def _room(state, tenant: str, quota: int, declared: str) -> int | None:
    """The bytes the tenant may still store under ``quota`` (0: none; then None); a body declared far past
    that is refused before it is read."""
    if not quota:
        return None
    used = await storage_used(state, tenant)
    if used >= quota or (
        declared.isascii() and declared.isdigit() and used + int(declared) - FORM_SLACK > quota
    ):
        raise over_quota(state, used, quota)
    return quota - used


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


@router.get("/files/{file_id}/content", response_class=StreamingResponse)
async def file_content(file_id: str, state: State, tenant: Tenant) -> StreamingResponse:
    found = await _file(state, tenant, file_id)
    try:
        reader = await open_file(state, file_id)
    except FileNotFoundError:
        raise ApiError(404, f"no file {file_id!r}", param="file_id") from None
    headers = {"Content-Length": str(found.bytes)}
    return StreamingResponse(file_chunks(reader), media_type="application/jsonl", headers=headers)


@router.delete("/files/{file_id}", response_model=FileDeleted)
async def delete_file(file_id: str, state: State, tenant: Tenant) -> FileDeleted:
    await _file(state, tenant, file_id)
    await drop_file(state, file_id, tenant)
    return FileDeleted(id=file_id)
