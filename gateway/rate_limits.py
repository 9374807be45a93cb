"""A tenant's limits on requests, enforced at admission for every gateway replica at once (the counts are
in Redis, see ``dllm_contracts.queue.limit_scripts``): requests and tokens per fixed minute of Redis's
clock, requests in flight. A request over a limit gets OpenAI's 429 (``rate_limit_exceeded``) with
``Retry-After``; every answer of a limited key carries OpenAI's ``x-ratelimit-*`` headers.

A request counts its tokens as every choice's prompt and ``max_tokens`` when it is admitted; when a
whole (not streamed) answer is delivered, the tokens it did not generate are given back to the window it
was counted in. Its place in flight is held by a ticket that expires with the request's deadline (and a
margin), so a gateway that dies holding tickets leaks nothing for longer than that.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

from dllm_contracts.queue.limit_ops import Admission, LimitOps
from dllm_contracts.queue.resilience import REDIS_ERRORS
from gateway.errors import ApiError
from gateway.key_limits import Caller
from gateway.metrics import CONCURRENCY, RPM, TPM

logger = logging.getLogger(__name__)
TICKET_MARGIN_S = 30  # a ticket outlives its request's deadline by this much


def duration(ms: int) -> str:
    """A time as OpenAI's reset headers write one: ``1s``, ``0.25s``, ``6m0s``."""
    minutes, rest = divmod(max(0, ms), 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


@dataclass
class Ticket:
    """One admitted request's hold on its tenant's limits."""

    caller: Caller
    tokens: int  # counted at admission
    id: str = ""
    admission: Admission | None = None  # None: no limit on requests asked Redis anything
    released: bool = False

    def headers(self) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for the limits this key has."""
        if self.admission is None:
            return {}
        limits, seen, out = self.caller.limits, self.admission, {}
        reset = duration(seen.reset_ms)
        for kind, limit, used in (
            ("requests", limits.rpm, seen.requests),
            ("tokens", limits.tpm, seen.tokens),
        ):
            if limit:
                out[f"x-ratelimit-limit-{kind}"] = str(limit)
                out[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - used))
                out[f"x-ratelimit-reset-{kind}"] = reset
        return out


def _ops(state) -> LimitOps:
    return LimitOps(state.queue.ops.keys)


async def admit(state, caller: Caller, tokens: int) -> Ticket:
    """Count a request of ``tokens`` against its tenant's limits, or refuse it with a 429."""
    ticket = Ticket(caller, tokens)
    limits = caller.limits
    if not limits.per_request:
        return ticket
    ticket.id = os.urandom(12).hex()
    life_ms = int((state.settings.request_timeout_s + TICKET_MARGIN_S) * 1000)
    call = _ops(state).admit(
        caller.tenant, limits.rpm, limits.tpm, limits.concurrency, tokens, ticket.id, life_ms
    )
    ticket.admission = Admission.parse(await state.calls.run(call))
    if ticket.admission.refused:
        raise _refusal(state, ticket)
    return ticket


def _refusal(state, ticket: Ticket) -> ApiError:
    seen, limits = ticket.admission, ticket.caller.limits
    headers = ticket.headers()
    retry_s = math.ceil(seen.reset_ms / 1000)
    if seen.refused == "too_large":
        message = (
            f"this request needs {ticket.tokens} tokens (its prompts and max_tokens); this key's limit is "
            f"{limits.tpm} tokens per minute: lower max_tokens or the prompt"
        )
        state.metrics.count_rejection(TPM)
        return ApiError(429, message, "rate_limit_error", headers=headers, code="rate_limit_exceeded")
    if seen.refused == "requests":
        reason = RPM
        message = f"this key's limit of {limits.rpm} requests per minute is reached; retry in {retry_s} s"
    elif seen.refused == "tokens":
        reason = TPM
        message = (
            f"this key's limit of {limits.tpm} tokens per minute is reached ({seen.tokens} used, this "
            f"request needs {ticket.tokens}); retry in {retry_s} s"
        )
    else:
        reason, retry_s = CONCURRENCY, state.settings.retry_after_s
        message = (
            f"this key has {seen.running} requests in flight, its limit of {limits.concurrency}; retry when "
            "one has ended"
        )
    state.metrics.count_rejection(reason)
    headers["Retry-After"] = str(max(1, retry_s))
    return ApiError(429, message, "rate_limit_error", headers=headers, code="rate_limit_exceeded")


async def release(state, ticket: Ticket | None, unused_tokens: int = 0) -> None:
    """The request ended (answered, failed, cancelled, expired): its place in flight is free and the
    tokens it did not use are given back. Best effort: with Redis away the ticket expires."""
    if ticket is None or ticket.admission is None or ticket.released:
        return
    ticket.released = True
    call = _ops(state).release(ticket.caller.tenant, ticket.id, ticket.admission.window, unused_tokens)
    try:
        await state.calls.run(call)
    except REDIS_ERRORS as exc:
        logger.warning("could not release a request's limits (it expires by itself): %s", exc)


@dataclass
class Admitted:
    """One API request's admission: who it comes from, and once its requests are counted, its ticket."""

    caller: Caller
    ticket: Ticket | None = None
    reserved: int = 0  # the max_tokens of its choices, counted at admission
    generated: int | None = None  # the tokens its whole answer generated (None: not known, a stream)

    async def admit(self, state, prompt_tokens: int, max_tokens: int) -> None:
        self.reserved = max_tokens
        self.ticket = await admit(state, self.caller, prompt_tokens + max_tokens)

    def headers(self) -> dict[str, str]:
        return {} if self.ticket is None else self.ticket.headers()

    async def end(self, state) -> None:
        unused = 0 if self.generated is None else self.reserved - self.generated
        await release(state, self.ticket, unused)
