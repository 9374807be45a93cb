"""Who owns a file or a batch, and the per-tenant listings.

A tenant is derived from the API key that made the request (a hash: the key itself is never stored);
without API keys every client is the one tenant ``anonymous``. Files, batches and batch outputs belong
to the tenant that created them: another tenant gets a 404, as for an id that does not exist.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Request

from dllm_contracts.queue.ops import as_text, text_of
from gateway.api_keys import ANONYMOUS
from gateway.errors import ApiError
from gateway.key_limits import Caller, tenant_of_key
from gateway.state import State, authorization_of

TENANT_FIELD = "tenant"  # the field of a file's or a batch's hash that names its owner
__all__ = ["ANONYMOUS", "CurrentCaller", "Tenant", "tenant_of_key"]


async def current_caller(request: Request, state: State) -> Caller:
    """Who the request comes from (its key was already checked by ``require_api_key``)."""
    return state.api_keys.caller_of(authorization_of(request.scope["headers"]))


async def current_tenant(caller: Annotated[Caller, Depends(current_caller)]) -> str:
    """The caller's tenant: a hash of its key, or of the tenant name its key's line gives (the key itself
    is never stored); ``anonymous`` without keys."""
    return caller.tenant


CurrentCaller = Annotated[Caller, Depends(current_caller)]
Tenant = Annotated[str, Depends(current_tenant)]


def belongs(record_tenant, tenant: str) -> bool:
    """Whether a record belongs to ``tenant`` (a record from before tenancy is ``anonymous``'s)."""
    return (text_of(record_tenant) or ANONYMOUS) == tenant


def owned(record_tenant, tenant: str, what: str, identifier: str, param: str) -> None:
    """404 unless the record belongs to ``tenant``."""
    if not belongs(record_tenant, tenant):
        raise ApiError(404, f"no {what} {identifier!r}", param=param)


async def add_to_index(state, key: str, identifier: str, created_at: int, ttl_s: int) -> None:
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.zadd(key, {identifier: created_at})
        pipe.zremrangebyscore(key, "-inf", int(time.time()) - ttl_s)  # what has expired by now
        pipe.expire(key, ttl_s)
        await pipe.execute()


async def page(
    state, key: str, after: str | None, limit: int, newest_first: bool = True
) -> tuple[list[str], bool]:
    """Up to ``limit`` ids of the index after the id ``after`` (pagination), and whether more follow:
    read from Redis a page at a time (ids of one second sort by their time-ordered names)."""
    start = 0
    if after is not None:
        rank = await (state.redis.zrevrank(key, after) if newest_first else state.redis.zrank(key, after))
        if rank is None:
            return [], False
        start = rank + 1
    ids = as_text(await state.redis.zrange(key, start, start + limit, desc=newest_first))
    return ids[:limit], len(ids) > limit
