"""A tenant's limits as plain script calls (see ``limit_scripts``), with their replies read."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_contracts.queue.keys import ServiceKeys
from dllm_contracts.queue.ops import ScriptCall, text_of

WINDOW_MS = 60_000  # requests and tokens are counted per minute


@dataclass(frozen=True)
class Admission:
    """LIMIT_ADMIT's answer for one request."""

    refused: str  # '' when admitted; else 'too_large', 'requests', 'tokens' or 'concurrency'
    requests: int  # requests counted in the current window (this one included when admitted)
    tokens: int  # tokens counted in the current window
    running: int  # the tenant's requests in flight
    reset_ms: int  # until the window ends (its counts start again from zero)
    window: int  # the window's start (ms, Redis's clock): where a refund goes

    @classmethod
    def parse(cls, reply: list) -> Admission:
        refused, *numbers = reply
        return cls(text_of(refused), *(int(n) for n in numbers))


class LimitOps:
    def __init__(self, keys: ServiceKeys) -> None:
        self.keys = keys

    def admit(
        self, tenant: str, rpm: int, tpm: int, concurrency: int, tokens: int, ticket: str, ticket_ms: int
    ) -> ScriptCall:
        """Admit one request of ``tokens`` (its prompts and the most it may generate) for ``tenant`` under
        its limits (0: none); ``ticket`` holds one of its requests in flight for at most ``ticket_ms``."""
        keys = [self.keys.limits_of(tenant), self.keys.running_of(tenant)]
        return ScriptCall("LIMIT_ADMIT", keys, [rpm, tpm, concurrency, tokens, ticket, ticket_ms, WINDOW_MS])

    def release(self, tenant: str, ticket: str, window: int, unused_tokens: int) -> ScriptCall:
        keys = [self.keys.limits_of(tenant), self.keys.running_of(tenant)]
        return ScriptCall("LIMIT_RELEASE", keys, [ticket, window, max(0, unused_tokens)])

    def reserve_batch_lines(
        self, tenant: str, limit: int, batch_id: str, lines: int, ttl_ms: int
    ) -> ScriptCall:
        return ScriptCall(
            "BATCH_LINES_ADMIT", [self.keys.batch_lines_of(tenant)], [limit, batch_id, lines, ttl_ms]
        )
