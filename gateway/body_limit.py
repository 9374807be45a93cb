"""Request bodies larger than the service allows are refused with a 413 before they are parsed.

A declared ``Content-Length`` over the limit is answered at once, unread; a body sent without one (chunked)
is counted as it arrives and refused the moment it passes the limit. File uploads have a limit of their
own (``max_upload_bytes``); every other body has ``max_body_bytes``.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException

from gateway.errors import error_body
from gateway.settings import GatewaySettings

UPLOADS = "/v1/files"


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` (FastAPI passes an ``HTTPException`` met while reading a body through)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than this service's limit of {limit} bytes")


def body_limit_for(settings: GatewaySettings, path: str) -> int:
    """The largest body a request to ``path`` may have."""
    return settings.max_upload_bytes if path == UPLOADS else settings.max_body_bytes


class BodyLimit:
    """Pure ASGI middleware: the limit for the request's path, checked before the app reads a byte."""

    def __init__(self, app, settings: GatewaySettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit_for(self.settings, scope["path"])
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(send, BodyTooLarge(limit))
            return
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise BodyTooLarge(limit)
            return message

        await self.app(scope, counting_receive, send)


async def _refuse(send, exc: BodyTooLarge) -> None:
    payload = json.dumps(error_body(exc.detail, "invalid_request_error")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
