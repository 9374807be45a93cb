"""The connection classes of every client ``connect`` makes, by URL scheme: redis-py's own, whose failures
under a command are classified (``resilience.ConnectionFaults``: a Python error out of a send or a read is a
ConnectionError) and, on the asyncio client, whose commands hiredis packs (``packing.HiredisPacking``)."""

from __future__ import annotations

from urllib.parse import urlparse

import redis
import redis.asyncio as aioredis

from dllm_contracts.queue.packing import HiredisPacking
from dllm_contracts.queue.resilience import AsyncConnectionFaults, ConnectionFaults


class FaultAwareConnection(ConnectionFaults, redis.Connection):
    """``redis://``, blocking"""


class FaultAwareSSLConnection(ConnectionFaults, redis.SSLConnection):
    """``rediss://``, blocking"""


class FaultAwareUnixConnection(ConnectionFaults, redis.UnixDomainSocketConnection):
    """``unix://``, blocking"""


class PackedConnection(HiredisPacking, AsyncConnectionFaults, aioredis.Connection):
    """``redis://``, asyncio"""


class PackedSSLConnection(HiredisPacking, AsyncConnectionFaults, aioredis.SSLConnection):
    """``rediss://``, asyncio"""


class PackedUnixConnection(HiredisPacking, AsyncConnectionFaults, aioredis.UnixDomainSocketConnection):
    """``unix://``, asyncio"""


_BLOCKING = {
    "redis": FaultAwareConnection,
    "rediss": FaultAwareSSLConnection,
    "unix": FaultAwareUnixConnection,
}
_ASYNCIO = {"redis": PackedConnection, "rediss": PackedSSLConnection, "unix": PackedUnixConnection}


def _transport(url: str) -> str:
    """``redis``, ``rediss`` or ``unix``: how the URL's connections reach Redis (a cluster's too)."""
    scheme = urlparse(url).scheme.split("+", 1)[0]
    return scheme if scheme in _BLOCKING else "redis"


def connection_class(url: str, asynchronous: bool) -> type:
    """The connection class for ``url``'s clients, blocking or asyncio."""
    return (_ASYNCIO if asynchronous else _BLOCKING)[_transport(url)]
