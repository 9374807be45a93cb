"""Files: their bytes in the file store (``gateway.file_store``), their records in Redis.

A file (an upload, or a batch's output or errors) is written to the store as a stream, and its record
(filename, size, purpose, tenant, times, the object holding its bytes) is committed after, in one script
that charges its bytes to the tenant's storage and refuses them past the tenant's quota
(``dllm_contracts.queue.file_scripts``). Until then its id is in the uploading set, so bytes whose
gateway died before the commit are found and deleted by the sweeper (``gateway.file_sweeper``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO

from dllm_contracts.queue import file_scripts
from dllm_contracts.queue.keys import new_request_id
from dllm_contracts.queue.ops import ScriptCall, text_of
from gateway.errors import ApiError
from gateway.file_store import CHUNK
from gateway.metrics import STORAGE
from gateway.schemas import FileObject
from gateway.tenancy import TENANT_FIELD

OBJECT_FIELD = "object"  # the record's field naming the store object that holds the file's bytes
META_FIELDS = ["filename", "bytes", "created_at", "purpose", TENANT_FIELD, "expires_at"]
RECORD_GRACE_S = 7 * 86400  # a record outlives its retention by this in Redis: the sweeper drops it first


def object_name(state, file_id: str) -> str:
    return f"{state.settings.service}/{file_id}"


def over_quota(state, used: int, quota: int) -> ApiError:
    """OpenAI answers a file that would pass an organization's storage limit with a 400 (counted as a
    rejection for storage)."""
    state.metrics.count_rejection(STORAGE)
    return ApiError(
        400,
        f"this upload would take your stored files past your storage quota of {quota} bytes "
        f"({used} bytes used); delete files you no longer need",
        param="file",
        code="storage_quota_exceeded",
    )


def record_ttl_s(state) -> int:
    return state.settings.file_ttl_s + RECORD_GRACE_S


async def storage_used(state, tenant: str) -> int:
    return int(await state.redis.get(state.queue.ops.keys.storage_used(tenant)) or 0)


async def write_file(
    state,
    tenant: str,
    chunks: AsyncIterator[bytes],
    describe: Callable[[], tuple[str, str]],
    file_id: str | None = None,
    quota: int | None = None,
) -> FileObject:
    """A file of ``tenant``'s (new, or ``file_id`` written again) from ``chunks``, kept for ``file_ttl_s``;
    ``describe()``, called once every chunk is written, gives its filename and purpose (or raises).
    ``quota``: the bytes the tenant's files may take (its key's ``storage``; 0: no limit), refused past it
    with a 400 whichever gateway took the other files; None: its bytes are charged without a refusal (a
    batch's output). An exception
    from ``chunks`` or ``describe`` (a refusal while reading the upload, a client gone) leaves nothing
    behind."""
    keys, file_id = state.queue.ops.keys, file_id or new_request_id("file")
    await _started(state, file_id)
    name = object_name(state, file_id)
    writer = await asyncio.to_thread(state.files.writer, name)
    size, written = 0, False
    try:
        async for chunk in _gathered(chunks):
            size += len(chunk)
            await asyncio.to_thread(writer.write, chunk)
        filename, purpose = describe()
        await asyncio.to_thread(writer.commit)
        written = True
        now = int(time.time())
        meta = {"filename": filename, "bytes": size, "created_at": now, "purpose": purpose}
        meta["expires_at"] = now + state.settings.file_ttl_s
        record = meta | {TENANT_FIELD: tenant, OBJECT_FIELD: name}
        args = [file_id, size, quota or 0, "0" if quota is None else "1", record_ttl_s(state)]
        args += [now, meta["expires_at"], *(str(x) for pair in record.items() for x in pair)]
        call = ScriptCall("FILE_COMMIT", file_scripts.commit_keys(keys, file_id, tenant), args)
        committed, used = await state.queue.run(call)
        if committed == 0:
            raise over_quota(state, int(used), quota or 0)
        if committed == -1:
            raise ApiError(408, "the upload took too long; send it again", code="upload_timeout")
        return FileObject(id=file_id, **meta)
    except BaseException:
        await asyncio.shield(_give_up(state, file_id, writer, written))
        raise


async def _started(state, file_id: str) -> None:
    keys = state.queue.ops.keys
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.zadd(keys.files_uploading, {file_id: int(time.time())})
        pipe.expire(keys.files_uploading, record_ttl_s(state))
        await pipe.execute()


async def _give_up(state, file_id: str, writer, written: bool) -> None:
    """An upload that failed: its bytes deleted (unless a record of the same id holds them: a batch's
    output written before), its id out of the uploading set. What a fault leaves here, the sweeper does."""
    keys = state.queue.ops.keys
    with contextlib.suppress(Exception):
        if not written:
            await asyncio.to_thread(writer.abort)
        elif not await state.redis.exists(keys.file(file_id)):
            await asyncio.to_thread(state.files.delete, object_name(state, file_id))
        await state.redis.zrem(keys.files_uploading, file_id)


async def _gathered(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The chunks joined into pieces of about ``CHUNK`` bytes (one thread hop per piece written)."""
    pending: list[bytes] = []
    held = 0
    async for chunk in chunks:
        pending.append(chunk)
        held += len(chunk)
        if held >= CHUNK:
            yield b"".join(pending)
            pending, held = [], 0
    if pending:
        yield b"".join(pending)


async def store_file(
    state, tenant: str, filename: str, purpose: str, content: bytes, file_id: str | None = None
) -> FileObject:
    """A file written whole from memory (small files: tests, tools); never refused by the quota."""

    async def one():
        yield content

    return await write_file(state, tenant, one(), lambda: (filename, purpose), file_id)


async def open_file(state, file_id: str) -> BinaryIO:
    """The file's bytes for reading (in a thread: its ``read`` blocks); ``FileNotFoundError`` when it has
    none. A record written before files had a store holds its bytes itself."""
    key = state.queue.ops.keys.file(file_id)
    name = text_of(await state.redis.hget(key, OBJECT_FIELD))
    if name is not None:
        return await asyncio.to_thread(state.files.reader, name)
    content = await state.redis.hget(key, "content")
    if content is None:
        raise FileNotFoundError(file_id)
    return io.BytesIO(content)


async def file_chunks(reader: BinaryIO) -> AsyncIterator[bytes]:
    """A download: the file's bytes a piece at a time (closed at the end, or when the client goes)."""
    try:
        while chunk := await asyncio.to_thread(reader.read, CHUNK):
            yield chunk
    finally:
        await asyncio.to_thread(reader.close)


async def delete_file(state, file_id: str, tenant: str, only_expired: bool = False) -> bool:
    """Drop the file's record (its bytes no longer charged to its tenant), then delete its bytes; whether
    there was a record to drop. A fault between the two leaves its id in the trash, for the sweeper."""
    keys = state.queue.ops.keys
    args = [file_id, int(time.time()), "1" if only_expired else "0", record_ttl_s(state)]
    dropped = await state.queue.run(
        ScriptCall("FILE_DROP", file_scripts.drop_keys(keys, file_id, tenant), args)
    )
    in_trash = await state.redis.zscore(keys.files_trash, file_id)
    if in_trash is not None:
        await remove_bytes(state, file_id)
    return bool(dropped)


async def remove_bytes(state, file_id: str) -> None:
    """Delete a file's bytes from the store, then its id from the trash (idempotent)."""
    await asyncio.to_thread(state.files.delete, object_name(state, file_id))
    await state.redis.zrem(state.queue.ops.keys.files_trash, file_id)
