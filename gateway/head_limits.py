"""Limits on a request's head (its request line and headers), which uvicorn does not set.

A head larger than ``max_header_bytes`` is answered 431 (OpenAI's error JSON) and its connection closed;
a head that has not arrived in full ``header_timeout_s`` after the connection opened, or after its first
byte came, has its connection closed. Without them a client holds the gateway's memory with a header that
never ends, or a connection with a head sent a byte at a time.

``HeadLimits`` wraps the HTTP protocol uvicorn chose through uvicorn's public interface only (an asyncio
protocol built from the keyword arguments uvicorn passes): it sees each read before uvicorn does and
follows the requests' boundaries with httptools' parser, so every request of a keep-alive connection is
limited. A head is measured as its request line and headers complete, and by the line still arriving.
"""

from __future__ import annotations

import asyncio
import json
import logging

import httptools

from gateway.errors import error_body

logger = logging.getLogger(__name__)
HEADER_SEPARATORS = 4  # ": " and CRLF around a header's name and value


def guarded(protocol_class: type[asyncio.Protocol], settings, app) -> type[HeadLimits]:
    """``protocol_class`` (what uvicorn would run) under the head limits of the gateway ``settings``;
    ``app``: the gateway application whose metrics count a refused head."""
    attributes = {"inner_class": protocol_class, "settings": settings, "gateway": app}
    return type("GuardedHttpProtocol", (HeadLimits,), attributes)


class HeadLimits(asyncio.Protocol):
    inner_class: type[asyncio.Protocol]
    settings: object  # GatewaySettings: max_header_bytes, header_timeout_s
    gateway: object  # the gateway application (its ``state.gateway`` once started)

    def __init__(self, **uvicorn_arguments) -> None:
        self.inner = self.inner_class(**uvicorn_arguments)
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.guarding = True  # False once the connection is no longer HTTP/1.1 requests (an upgrade)
        self.in_head = True  # a connection's first bytes are a head
        self.head_bytes = 0  # the current head's completed parts (request line, headers)
        self.unparsed = 0  # bytes of the current head in reads where no part of it completed
        self.progress = False  # a part of a head completed during the current read
        self.in_url = False  # the request line is still arriving (its fragments counted as they come)
        self.too_large = False
        self.timer: asyncio.TimerHandle | None = None

    # asyncio protocol: forwarded to uvicorn's, after the limits are checked
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.inner.connection_made(transport)
        self._start_timer()

    def data_received(self, data: bytes) -> None:
        if self.guarding and not self._within_limits(data):
            return
        self.inner.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # httptools' callbacks: where each request's head begins and ends
    def on_message_begin(self) -> None:
        self.in_head, self.head_bytes, self.unparsed, self.progress = True, 0, 0, True
        self.in_url = False

    def on_url(self, url: bytes) -> None:
        self.in_url = True
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + HEADER_SEPARATORS)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self._stop_timer()

    def _count(self, size: int) -> None:
        self.head_bytes += size
        self.progress = True
        if self.head_bytes > self.settings.max_header_bytes:
            self.too_large = True

    def _within_limits(self, data: bytes) -> bool:
        self.progress = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.guarding = False
        except httptools.HttpParserError:  # uvicorn answers it (400) from the same bytes
            self.guarding = False
        if self.in_head:
            self._measure_unfinished_line(data)
            self.too_large = (
                self.too_large or self.head_bytes + self.unparsed > self.settings.max_header_bytes
            )
            if self.timer is None:
                self._start_timer()
        if self.too_large:
            self._refuse()
            return False
        return True

    def _measure_unfinished_line(self, data: bytes) -> None:
        """The header line still arriving: what follows the read's last CRLF, or with none, the whole
        read added to what came before (the request line's fragments are counted by ``on_url``)."""
        end = data.rfind(b"\r\n")
        if end >= 0:
            self.in_url, self.unparsed = False, len(data) - end - 2
        elif not self.in_url:
            self.unparsed = (0 if self.progress else self.unparsed) + len(data)

    def _refuse(self) -> None:
        limit = self.settings.max_header_bytes
        logger.warning("a request head over %d bytes: answered 431, connection closed", limit)
        message = f"the request's headers are larger than this service's limit of {limit} bytes"
        body = json.dumps(error_body(message, "invalid_request_error")).encode()
        head = (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        self.guarding = False
        self._stop_timer()
        self._count_response(431)
        self.transport.write(head + body)
        self.transport.close()

    def _count_response(self, status: int) -> None:
        state = getattr(self.gateway.state, "gateway", None)
        if state is not None:
            state.metrics.count_request("unmatched", status)

    def _start_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.settings.header_timeout_s, self._head_too_slow)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_too_slow(self) -> None:
        self.timer = None
        if self.in_head and self.guarding and not self.transport.is_closing():
            logger.info(
                "a request head not complete within %ss: connection closed", self.settings.header_timeout_s
            )
            self.transport.close()
