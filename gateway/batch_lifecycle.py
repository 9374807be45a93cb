"""A batch from its queued lines to its end: expiry when its completion window closes, and finalization
(its output and error files written as files of its tenant) once every line is accounted for.

Whichever gateway reads a batch moves it on (``advance``), and the gateway holding the batch's lease
(``gateway.batch_keeper``) watches it until it ends, so a batch ends whether or not anyone polls it. Finalizing is done by one gateway at a time
(a lock with an expiry: a gateway that dies while writing is taken over) and writes files whose ids are
derived from the batch's, so doing it again changes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time

from dllm_contracts.queue.ops import text_of
from dllm_contracts.queue.resilience import REDIS_ERRORS
from gateway.batch_ingest import cancel_members
from gateway.batch_lines import release_batch_lines
from gateway.batch_results import result_lines
from gateway.stored_files import write_file
from gateway.tenancy import ANONYMOUS, TENANT_FIELD

logger = logging.getLogger(__name__)

ENDED = ("completed", "failed", "cancelled", "expired")
FINALIZE_LOCK_S = 60  # how long one gateway may take to write a batch's files before another takes over
WATCH_S = 1.0  # how often the creating gateway looks at a running batch
OUTPUT_PURPOSE = "batch_output"  # OpenAI's purpose of a batch's output and error files
WRITE_LINES = 1000  # result lines encoded and written to the file store at a time


async def read_record(state, batch_id: str) -> dict[str, str] | None:
    raw = await state.redis.hgetall(state.queue.ops.keys.batch(batch_id))
    return {text_of(k): text_of(v) for k, v in raw.items()} if raw else None


def accounted(record: dict[str, str]) -> bool:
    """Whether every line of the batch has its result (or its error line)."""
    return int(record["completed"]) + int(record["failed"]) >= int(record["total"])


async def advance(state, batch_id: str, record: dict[str, str]) -> dict[str, str]:
    """The batch's record, moved on as far as it can go now: expired lines ended at the end of its
    window, files written once every line is accounted for."""
    if record["status"] in ENDED:
        return record
    if record["status"] in ("validating", "in_progress") and time.time() >= int(record["expires_at"]):
        record = await _expire(state, batch_id, record)
    if accounted(record):
        record = await _finalize(state, batch_id, record)
    return record


async def watch(state, batch_id: str) -> None:
    """Move the batch on until it has ended (Redis faults are waited out)."""
    while True:
        try:
            record = await read_record(state, batch_id)
            if record is None or (await advance(state, batch_id, record))["status"] in ENDED:
                return
        except REDIS_ERRORS as exc:
            logger.warning("batch %s: %s; trying again", batch_id, exc)
        await asyncio.sleep(WATCH_S)


async def _expire(state, batch_id: str, record: dict[str, str]) -> dict[str, str]:
    """The window has closed: lines not started end as expired (the running ones finish)."""
    if "expiring_at" not in record:
        now = int(time.time())
        await state.redis.hsetnx(state.queue.ops.keys.batch(batch_id), "expiring_at", now)
        await cancel_members(batch_id, state, expire=True)
        record = await read_record(state, batch_id) or record | {"expiring_at": str(now)}
    return record


def _ending(record: dict[str, str]) -> str:
    if "ending" in record:
        return record["ending"]
    if record["status"] == "cancelling":
        return "cancelled"
    return "expired" if "expiring_at" in record else "completed"


async def _finalize(state, batch_id: str, record: dict[str, str]) -> dict[str, str]:
    keys = state.queue.ops.keys
    if not await state.redis.set(keys.batch_finalizing(batch_id), "1", nx=True, ex=FINALIZE_LOCK_S):
        return record  # another gateway is writing its files
    record = await read_record(state, batch_id) or record  # as it is now that this gateway holds it
    ending, key = _ending(record), keys.batch(batch_id)
    await state.redis.hset(key, "ending", ending)
    since = ("validating", "in_progress", "cancelling", "finalizing")
    if not await state.queue.run(
        state.queue.ops.batch_status(batch_id, "finalizing", since, "finalizing_at")
    ):
        await state.redis.delete(keys.batch_finalizing(batch_id))
        return await read_record(state, batch_id) or record
    entries = await state.redis.hvals(keys.batch_results(batch_id))
    output, errors = await asyncio.to_thread(result_lines, entries, record["endpoint"], state)
    final = {"status": ending, f"{ending}_at": int(time.time())}
    final |= {"completed": len(output), "failed": len(errors)}  # its counts are its files' lines
    for field, kind, lines in (("output_file_id", "output", output), ("error_file_id", "error", errors)):
        if lines:
            final[field] = await _write(state, record[TENANT_FIELD], batch_id, kind, lines)
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=final)
        pipe.delete(keys.batch_results(batch_id), keys.batch_finalizing(batch_id))
        pipe.zrem(keys.batch_leases, batch_id)
        release_batch_lines(pipe, state, record.get(TENANT_FIELD) or ANONYMOUS, batch_id)
        await pipe.execute()
    return await read_record(state, batch_id) or record


async def _write(state, tenant: str, batch_id: str, kind: str, lines: list[dict]) -> str:
    """The batch's ``kind`` file, written to the file store as a stream of its lines; charged to the
    tenant's storage, never refused (the work is done)."""

    async def content():
        for start in range(0, len(lines), WRITE_LINES):
            yield "".join(json.dumps(line) + "\n" for line in lines[start : start + WRITE_LINES]).encode()

    file_id = _file_id(batch_id, kind)
    named = (f"{batch_id}_{kind}.jsonl", OUTPUT_PURPOSE)
    await write_file(state, tenant, content(), lambda: named, file_id)  # charged, never refused
    return file_id


def _file_id(batch_id: str, kind: str) -> str:
    """The id of the batch's ``kind`` file: derived from the batch's (written again, the same file)."""
    stamp = batch_id[len("batch_") :].split("-")[0]  # its time (batch_TIME-RANDOM, or batch-TIME-RANDOM)
    return f"file-{stamp}-{hashlib.sha256(f'{batch_id}:{kind}'.encode()).hexdigest()[:32]}"
