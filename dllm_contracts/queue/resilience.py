"""Transient Redis faults, shared by the worker and the gateway: what counts as one, how clients are
configured to notice it, and bounded exponential backoff with full jitter for riding it out.

A restart, a failover or a frozen server shows up as a refused connection, a reset or a read
timeout (on a Redis Cluster also as CLUSTERDOWN, TRYAGAIN, redirections that run out of retries or a slot
not yet covered); all of them pass. Anything else (a wrong password, a script error) is a real error and is
not retried. Every client gets socket timeouts, so a frozen Redis is a ``TimeoutError`` after a few
seconds, never a call that blocks forever.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from redis.exceptions import (
    ClusterError,
    RedisClusterException,
    RedisError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    # a Redis Cluster failing over: CLUSTERDOWN (ClusterDownError, MasterDownError) and the redirections that
    # bounce between nodes whose slot tables have not converged yet until redis-py's own retries run out
    # ("TTL exhausted."): all ClusterErrors
    ClusterError,
    TryAgainError,  # a slot migrating
    SlotNotCoveredError,  # a Redis Cluster's slots not all served yet
)

# anything a Redis call can raise, fault or refusal (a cluster client's own errors are not RedisErrors)
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException)

SOCKET_TIMEOUT_S = 5.0  # longest a single Redis call may take; longer than any blocking wait we issue
CLIENT_OPTIONS = {
    "socket_timeout": SOCKET_TIMEOUT_S,
    "socket_connect_timeout": 2.0,
    "health_check_interval": 15,  # re-check idle pooled connections before use
}


@dataclass
class Backoff:
    """Delays of ``initial_s * factor**n``, capped at ``max_s``, each drawn uniformly below that bound."""

    initial_s: float = 0.05
    max_s: float = 2.0
    factor: float = 2.0
    attempt: int = 0

    def next_delay(self) -> float:
        bound = min(self.max_s, self.initial_s * self.factor**self.attempt)
        self.attempt += 1
        return random.uniform(0.0, bound)

    def reset(self) -> None:
        self.attempt = 0

    @property
    def failing(self) -> bool:
        return self.attempt > 0
