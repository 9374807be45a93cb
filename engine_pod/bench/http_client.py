"""A minimal asyncio HTTP/1.1 client for load generation: JSON POSTs, plain or server-sent events.

The benchmark's client runs on the machine it measures. httpx spends about 5 ms of CPU per request
(measured with py-spy: a third of a core under the shipped workload's burst), CPU the engine then does
not get; this client reads and writes the bytes and nothing else (one connection per request).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlparse

SSE_DATA = b"data: "
SSE_DONE = b"[DONE]"


class HttpError(RuntimeError):
    """A reply other than 200: its status and the server's own message (OpenAI's error JSON, if it is)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {_message(body)}")
        self.status = status


def _message(body: bytes) -> str:
    try:
        error = json.loads(body)["error"]
        return f"{error['message']}" + (f" (code {error['code']})" if error.get("code") else "")
    except (ValueError, KeyError, TypeError):
        return body[:300].decode(errors="replace").strip() or "no body"


class LoadClient:
    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        parsed = urlparse(base_url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"the load client speaks plain http://HOST:PORT, got {base_url!r}")
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.api_key = api_key

    async def post_json(self, path: str, body: dict) -> dict:
        """POST ``body``; the JSON reply (HttpError for a status other than 200)."""
        return await self._json(path, body)

    async def get_json(self, path: str) -> dict:
        """GET ``path``; the JSON reply (HttpError for a status other than 200)."""
        return await self._json(path, None)

    async def _json(self, path: str, body: dict | None) -> dict:
        reader, writer = await self._send(path, body)
        try:
            status, headers = await _read_head(reader)
            payload = await _read_body(reader, headers)
        finally:
            writer.close()
        if status != 200:
            raise HttpError(status, payload)
        return json.loads(payload)

    async def post_events(self, path: str, body: dict) -> AsyncIterator[dict]:
        """POST ``body`` (a streaming request); yield each server-sent event's JSON until [DONE]."""
        reader, writer = await self._send(path, body)
        try:
            status, headers = await _read_head(reader)
            if status != 200:
                raise HttpError(status, await _read_body(reader, headers))
            buffer = b""
            async for piece in _body_pieces(reader, headers):
                buffer += piece
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    for line in event.splitlines():
                        if line.startswith(SSE_DATA):
                            data = line[len(SSE_DATA) :]
                            if data == SSE_DONE:
                                return
                            yield json.loads(data)
        finally:
            writer.close()

    async def _send(self, path: str, body: dict | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A POST of ``body``, or a GET when it is None."""
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        head = [
            f"{'GET' if body is None else 'POST'} {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Content-Type: application/json",
            f"Content-Length: {len(payload)}",
            "Connection: close",
        ]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        return reader, writer


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    return b"".join([piece async for piece in _body_pieces(reader, headers)])


async def _body_pieces(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The body as it arrives: chunked transfer encoding, a Content-Length, or until the server closes."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        yield await reader.read()
