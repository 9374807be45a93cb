"""The gateway's HTTP/1.1 protocol: uvicorn's httptools protocol, answering the two endpoints that carry
the load without going through ASGI.

Through ASGI a request costs uvicorn's request cycle (a scope, message dicts for the body and for each
part of the answer, headers checked one by one with regular expressions, two writes), the middleware
layers and Starlette's request and response objects: about a fifth of the gateway's CPU per request
(py-spy). Here a ``POST /v1/completions`` or ``/v1/chat/completions`` whose body length is declared and
within the limit is answered by ``gateway.fast_path.respond`` (the same code the ASGI path runs) and
written by the protocol: a whole answer in one write, a stream as chunks as its events come. A stream
whose client leaves is cancelled at once (its requests are cancelled in the queue, as on the ASGI path).

Everything else (other endpoints, a chunked or oversized body, ``Expect: 100-continue``, an upgrade)
goes to the ASGI application as before, which also serves the two endpoints under any other ASGI
server. The protocol builds on uvicorn's internals (its request cycle and connection state): pyproject
pins uvicorn to the minor version it was written for.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httptools
from starlette.responses import Response, StreamingResponse
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr

from gateway.body_limit import body_limit_for
from gateway.errors import ApiError, server_error, shutting_down
from gateway.fast_path import ROUTES, respond

HOT_PATHS = {path.encode(): path for path in ROUTES}
CHUNK_END = b"0\r\n\r\n"
logger = logging.getLogger(__name__)


def protocol_for(app) -> type[GatewayProtocol]:
    """The protocol class uvicorn runs ``app`` (the gateway's ``HotPath``) with: ``http=`` of its config."""
    return type("GatewayProtocol", (GatewayProtocol,), {"gateway": app})


class GatewayProtocol(HttpToolsProtocol):
    gateway: Any  # the HotPath application (its ``state`` is its FastAPI app's)

    def on_headers_complete(self) -> None:
        exchange = self._hot_exchange()
        if exchange is None:
            super().on_headers_complete()
            return
        previous, self.cycle = self.cycle, exchange
        if previous is None or previous.response_complete:
            self._start_asgi_task(exchange, self.app)
        else:  # pipelined behind a request still being answered: started when that one is done
            self.flow.pause_reading()
            self.pipeline.appendleft((exchange, self.app))

    def _start_asgi_task(self, cycle: RequestResponseCycle, app) -> None:
        if not isinstance(cycle, HotExchange):
            super()._start_asgi_task(cycle, app)
            return
        cycle.task = task = self.loop.create_task(cycle.run())
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        if isinstance(cycle, HotExchange):
            cycle.client_left()

    def _hot_exchange(self) -> HotExchange | None:
        """An exchange answered here, or None: the request goes to the ASGI application."""
        if self.parser.get_method() != b"POST" or self.expect_100_continue or self.parser.should_upgrade():
            return None
        path = httptools.parse_url(self.url).path
        if path not in HOT_PATHS or self.root_path or self.limit_concurrency is not None:
            return None
        length, authorization = None, b""
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"authorization":
                authorization = value
        state = getattr(self.gateway.state, "gateway", None)  # None: not started
        if (
            state is None
            or length is None
            or not length.isdigit()
            or int(length) > body_limit_for(state.settings, HOT_PATHS[path])
        ):
            return None  # chunked, or over the limit: the ASGI path counts it or refuses it
        version = self.parser.get_http_version()
        self.scope["method"], self.scope["path"] = "POST", HOT_PATHS[path]
        self.scope["http_version"] = version
        return HotExchange(
            state,
            authorization.decode("latin-1"),
            scope=self.scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=version != "1.0" and self.parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )


class HotExchange(RequestResponseCycle):
    """One request to one of the two endpoints, answered without ASGI. The connection's protocol fills
    ``body`` and ``more_body`` and sets ``disconnected`` (uvicorn's cycle fields)."""

    def __init__(self, state, authorization: str, **cycle: Any) -> None:
        super().__init__(**cycle)
        self.state, self.authorization = state, authorization
        self.task: asyncio.Task | None = None
        self.streaming = False

    async def run(self) -> None:
        try:
            await self._serve()
        except asyncio.CancelledError:  # the client left, or the server's drain ran out
            self._fail(shutting_down(self.state.settings.retry_after_s))
        except Exception as exc:  # noqa: BLE001 - a bug here: answered as a bug in the handler is
            self.logger.error("Exception in the gateway's protocol", exc_info=exc)
            self._fail(server_error())
        finally:
            self.on_response = lambda: None

    def _fail(self, error: ApiError) -> None:
        if self.disconnected:
            return
        if self.response_started:  # a stream already under way: cut (the client sees no final chunk)
            self.transport.close()
            return
        self._write_whole(error.response())

    def client_left(self) -> None:
        """The connection was lost: a stream stops now (its generator, closed, cancels its requests); a
        whole answer's wait notices it at its next poll, as through ASGI."""
        if self.streaming and not self.response_complete and self.task is not None:
            self.task.cancel()

    async def _serve(self) -> None:
        path = self.scope["path"]
        response = await respond(self.state, path, self.authorization, self._body, self._is_disconnected)
        if self.disconnected:
            return
        if isinstance(response, StreamingResponse):
            await self._stream(response)
        else:
            self._write_whole(response)

    async def _body(self) -> bytes:
        while self.more_body and not self.disconnected:
            self.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        return bytes(self.body)

    async def _is_disconnected(self) -> bool:
        return self.disconnected

    def _count(self, status: int) -> None:
        path = self.scope["path"]
        self.state.metrics.count_request(path, status)
        if self.access_log:
            self.access_logger.info(  # the arguments uvicorn's access formatter takes apart
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                "POST",
                path,
                self.scope["http_version"],
                status,
            )

    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> list[bytes]:
        """The status line and headers (the response is counted, and logged if the access log is on)."""
        self._count(status)
        self.response_started = True
        head = [STATUS_LINE[status]]
        for name, value in self.default_headers + headers:
            head += [name, b": ", value, b"\r\n"]
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        return head

    def _write_whole(self, response: Response) -> None:
        """``response``'s headers carry its Content-Length (Starlette's responses set it)."""
        self.transport.write(
            b"".join([*self._head(response.status_code, response.raw_headers), response.body])
        )
        self._completed()

    async def _stream(self, response: Response) -> None:
        self.transport.write(
            b"".join(
                self._head(response.status_code, [*response.raw_headers, (b"transfer-encoding", b"chunked")])
            )
        )
        self.streaming = True
        async for chunk in response.body_iterator:
            if self.flow.write_paused:
                await self.flow.drain()
            if isinstance(chunk, str):
                chunk = chunk.encode()
            self.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        self.transport.write(CHUNK_END)
        self._completed()
        if response.background is not None:
            await response.background()

    def _completed(self) -> None:
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
