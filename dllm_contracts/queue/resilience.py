"""Transient Redis faults, shared by the worker and the gateway: what counts as one, how clients are
configured to notice it, and bounded exponential backoff with full jitter for riding it out.

A restart, a failover or a frozen server shows up as a refused connection, a reset or a read timeout, a
Redis that answers LOADING while it reads its data back (at its start, after a restart), and on a Redis
Cluster also as CLUSTERDOWN, TRYAGAIN, redirections that run out of retries or a slot not yet covered; all
of them pass. Anything else (a script error, a wrong type) is a real error and is not retried. Every
client gets socket timeouts, so a frozen Redis is a ``TimeoutError`` after a few seconds, never a call
that blocks forever.

A connection closed under a command in flight (a cluster client that meets a failover closes every node's
connections, those in use by other commands included) can also fail with a plain Python error out of
redis-py's socket and stream code, which redis-py passes on as it is: ``'NoneType' object has no attribute
'writelines'`` (its stream, set to None by the close), uvloop's ``the handler is closed``. Such an error is
classified by where it comes from, not by its type: whatever a connection's send or read raises that
redis-py did not classify itself is the connection failing, a ``ConnectionError`` (``connection_fault``).
Every client made by ``connect`` uses connections that say so (``ConnectionFaults``,
``AsyncConnectionFaults``), so redis-py's own retries (a cluster client's, which also refresh its view of
the nodes) and ours take it as the fault it is.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from redis.exceptions import (
    BusyLoadingError,
    ClusterError,
    RedisClusterException,
    RedisError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError,  # refused, reset, closed under a command (connection_fault)
    RedisTimeoutError,
    # LOADING: a Redis reading its append-only file or snapshot back, at its start or after a restart, refuses
    # every command until it is done (redis-py makes it a ConnectionError; named here for what it is)
    BusyLoadingError,
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


def is_loading(exc: BaseException) -> bool:
    """Whether ``exc`` is a Redis still reading its data back (LOADING): a fault that ends by itself."""
    return isinstance(exc, BusyLoadingError)


def connection_fault(exc: BaseException) -> RedisConnectionError | None:
    """The ``ConnectionError`` that ``exc``, raised by a connection's send or read, stands for: every step
    of those is I/O on the connection's socket or stream, and redis-py turns the errors it expects there into
    its own (kept as they are: None); any other ``Exception`` out of them is the connection failing under the
    command (closed by another task, its transport gone). A cancellation (not an ``Exception``) stays one."""
    if isinstance(exc, RedisError) or not isinstance(exc, Exception):
        return None
    return RedisConnectionError(f"the connection failed under the command ({type(exc).__name__}: {exc})")


class _FaultsClassified:
    """A ``with`` block out of which a connection's failure leaves as ``connection_fault`` classifies it."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        fault = None if exc is None else connection_fault(exc)
        if fault is not None:
            raise fault from exc
        return False  # nothing raised, or raised as it is


_CLASSIFIED = _FaultsClassified()  # it holds no state: one serves every call


class ConnectionFaults:
    """Mixin for redis-py's blocking connection classes: a send or a read fails with ``connection_fault``'s
    ConnectionError where redis-py would pass a Python error on."""

    def send_packed_command(self, *args, **kwargs):
        with _CLASSIFIED:
            return super().send_packed_command(*args, **kwargs)

    def read_response(self, *args, **kwargs):
        with _CLASSIFIED:
            return super().read_response(*args, **kwargs)


class AsyncConnectionFaults:
    """``ConnectionFaults`` for redis-py's asyncio connection classes."""

    async def send_packed_command(self, *args, **kwargs):
        with _CLASSIFIED:
            return await super().send_packed_command(*args, **kwargs)

    async def read_response(self, *args, **kwargs):
        with _CLASSIFIED:
            return await super().read_response(*args, **kwargs)


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
