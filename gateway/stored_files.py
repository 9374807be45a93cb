"""Files kept in Redis: what an upload stores, and what a finished batch writes (its output and errors)."""

from __future__ import annotations

import time

from dllm_contracts.queue.keys import new_request_id
from gateway.schemas import FileObject
from gateway.tenancy import TENANT_FIELD, add_to_index

META_FIELDS = ["filename", "bytes", "created_at", "purpose", TENANT_FIELD, "expires_at"]  # content aside


async def store_file(
    state, tenant: str, filename: str, purpose: str, content: bytes, file_id: str | None = None
) -> FileObject:
    """A file of ``tenant``'s (new, or ``file_id``, written again), listed with its files, kept for
    ``file_ttl_s``."""
    file_id = file_id or new_request_id("file")
    now = int(time.time())
    meta = {"filename": filename, "bytes": len(content), "created_at": now, "purpose": purpose}
    meta["expires_at"] = now + state.settings.file_ttl_s
    key = state.queue.ops.keys.file(file_id)
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=meta | {"content": content, TENANT_FIELD: tenant})
        pipe.expire(key, state.settings.file_ttl_s)
        await pipe.execute()
    await add_to_index(
        state, state.queue.ops.keys.files_of(tenant), file_id, meta["created_at"], state.settings.file_ttl_s
    )
    return FileObject(id=file_id, **meta)
