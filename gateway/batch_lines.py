"""A tenant's queued batch lines: every batch reserves its lines when it is created, against its key's
``batch_lines`` limit (429 when the tenant's batches not yet ended would hold more), and gives them back
when it ends. A reservation expires after the batch's completion window and a margin, so one whose
batch was never finalized (its gateways gone) does not hold the tenant's room for ever."""

from __future__ import annotations

from dllm_contracts.queue.limit_ops import LimitOps
from gateway.errors import ApiError
from gateway.key_limits import Caller
from gateway.metrics import BATCH_LINES

MARGIN_S = 3600  # a reservation outlives its batch's completion window by this much


async def reserve_batch_lines(state, caller: Caller, batch_id: str, lines: int) -> None:
    limit = caller.limits.batch_lines
    ttl_ms = (state.settings.batch_window_s + MARGIN_S) * 1000
    call = LimitOps(state.queue.ops.keys).reserve_batch_lines(caller.tenant, limit, batch_id, lines, ttl_ms)
    reserved, held = await state.queue.run(call)
    if not reserved:
        state.metrics.count_rejection(BATCH_LINES)
        raise ApiError(
            429,
            f"this batch has {lines} lines and this key's batches not yet ended hold {held}; its limit is "
            f"{limit} queued batch lines: retry when a batch has ended",
            "rate_limit_error",
            param="input_file_id",
            headers={"Retry-After": str(state.settings.retry_after_s)},
            code="rate_limit_exceeded",
        )


def release_batch_lines(pipe, state, tenant: str, batch_id: str) -> None:
    """Give a batch's lines back (a command added to ``pipe``, which the caller runs)."""
    pipe.hdel(state.queue.ops.keys.batch_lines_of(tenant), batch_id)
