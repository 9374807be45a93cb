"""The file sweeper: every gateway process, every ``file_sweep_s``, removes from the file store what no
record holds any more: files past their retention (record dropped and their bytes no longer charged to
their tenant, then their bytes deleted), uploads their gateway never finished (killed midway), and the
ids left in the trash by a fault between a record's drop and its bytes' deletion. Unfinished writes are
told from uploads under way by the uploading set, not by the store's clock alone.

Every step is a script that re-checks what it acts on, and deleting bytes twice is harmless, so any
number of gateway replicas sweep the same Redis and store at once."""

from __future__ import annotations

import asyncio
import logging
import time

from dllm_contracts.queue import file_scripts
from dllm_contracts.queue.ops import ScriptCall, as_text, text_of
from dllm_contracts.queue.resilience import REDIS_ERRORS
from gateway.stored_files import delete_file, object_name, record_ttl_s, remove_bytes
from gateway.tenancy import ANONYMOUS, TENANT_FIELD

logger = logging.getLogger(__name__)

SWEEP_COUNT = 200  # ids read per set per sweep


async def sweep_files_forever(state) -> None:
    while True:
        try:
            await sweep_files(state)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis or the store unreachable, a disk error: the next sweep retries
            kind = "Redis" if isinstance(exc, REDIS_ERRORS) else "the file store"
            logger.warning("file sweep: %s (%s); trying again", exc, kind)
        await asyncio.sleep(state.settings.file_sweep_s)


async def sweep_files(state) -> None:
    """One sweep (see the module's description)."""
    keys, now = state.queue.ops.keys, int(time.time())
    for file_id in as_text(await state.redis.zrangebyscore(keys.files_expiring, "-inf", now, 0, SWEEP_COUNT)):
        tenant = text_of(await state.redis.hget(keys.file(file_id), TENANT_FIELD)) or ANONYMOUS
        await delete_file(state, file_id, tenant, only_expired=True)
    cutoff = now - state.settings.max_upload_s
    stale = await state.redis.zrangebyscore(keys.files_uploading, "-inf", f"({cutoff}", 0, SWEEP_COUNT)
    for file_id in as_text(stale):
        args = [file_id, cutoff, now, record_ttl_s(state)]
        await state.queue.run(ScriptCall("FILE_ABANDON", file_scripts.abandon_keys(keys, file_id), args))
    for file_id in as_text(await state.redis.zrange(keys.files_trash, 0, SWEEP_COUNT - 1)):
        await remove_bytes(state, file_id)
    under_way = await state.redis.zrangebyscore(keys.files_uploading, cutoff, "+inf")  # read before listing
    writing = {object_name(state, file_id) for file_id in as_text(under_way)}
    removed = await asyncio.to_thread(state.files.sweep_partial, state.settings.max_upload_s, writing)
    if removed:
        logger.info("file sweep: removed %d unfinished uploads", removed)
