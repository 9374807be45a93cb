"""Redis clients from a URL: one Redis (``redis://``, ``rediss://``) or a Redis Cluster (``redis+cluster://``,
``rediss+cluster://``, naming any one node), with the password from ``$REDIS_PASSWORD`` when the URL has
none. Every process that talks to the queue (worker, gateway, operator, bench) connects through here, so
a URL means the same thing everywhere.
"""

from __future__ import annotations

import functools
import os
from typing import Any
from urllib.parse import urlparse

REDIS_PASSWORD_ENV = "REDIS_PASSWORD"  # what the operator injects from spec.redis.passwordSecretRef
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster_url(url: str) -> bool:
    return urlparse(url).scheme in _CLUSTER_SCHEMES


def node_url(url: str) -> str:
    """The URL with a plain scheme (what redis-py parses); a cluster URL names one of its nodes."""
    scheme = urlparse(url).scheme
    return _CLUSTER_SCHEMES[scheme] + url[len(scheme) :] if scheme in _CLUSTER_SCHEMES else url


def _password_option(url: str) -> dict[str, Any]:
    password = os.environ.get(REDIS_PASSWORD_ENV)
    return {"password": password} if password and not urlparse(url).password else {}


@functools.cache
def _driver_options() -> dict[str, Any]:
    """The client's name and version for CLIENT SETINFO, read once: redis-py 7+ otherwise reads its
    package metadata from disk for every new connection (a third of the gateway's CPU under a burst)."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # older redis-py computes its default once already
        return {}
    from redis.utils import get_lib_version

    return {"driver_info": DriverInfo(lib_version=get_lib_version())}


def _options(url: str, options: dict[str, Any]) -> dict[str, Any]:
    return _driver_options() | _password_option(url) | options


def sync_client(url: str, **options: Any):
    """A blocking client (``redis.Redis`` or ``redis.cluster.RedisCluster``)."""
    import redis
    from redis.cluster import RedisCluster

    from dllm_contracts.queue.connections import connection_class

    options = _options(url, options) | {"connection_class": connection_class(url, asynchronous=False)}
    if is_cluster_url(url):
        # the class decides the transport (TLS included): a rediss:// URL's own would replace it
        return RedisCluster.from_url(_plain(node_url(url)), **options)
    return redis.Redis.from_url(url, **options)


def async_client(url: str, **options: Any):
    """An asyncio client (``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``)."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    from dllm_contracts.queue.connections import connection_class

    options = _options(url, options)
    chosen = connection_class(url, asynchronous=True)
    if is_cluster_url(url):
        return _connecting_with(RedisCluster.from_url(node_url(url), **options), chosen)
    return aioredis.Redis.from_url(url, connection_class=chosen, **options)


def _plain(url: str) -> str:
    """``url`` with the scheme ``redis``: its transport is then the connection class's alone."""
    return "redis" + url[len(urlparse(url).scheme) :]


def _connecting_with(cluster, chosen: type):
    """``cluster`` (asyncio) opening its connections as ``chosen``: redis-py's asyncio cluster client takes
    no connection class, so it is set where its nodes read theirs (those known now, and the keyword
    arguments every node it discovers is made with). Before the first command: no connection is open yet."""
    cluster.connection_kwargs["connection_class"] = chosen
    for node in cluster.get_nodes() or cluster.startup_nodes:
        node.connection_class = chosen
    return cluster
