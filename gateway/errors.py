"""OpenAI-style error bodies: every 4xx says what was wrong in one sentence."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine_pod.queue.resilience import TRANSIENT_ERRORS


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.headers = (
            status,
            message,
            kind,
            param,
            headers or {},
        )


def queue_unreachable(what: str, retry_after_s: int) -> ApiError:
    """503 with Retry-After: Redis cannot be reached right now (never a 500)."""
    return ApiError(
        503,
        f"{what}: the queue is unreachable; retry later",
        "server_error",
        headers={"Retry-After": str(retry_after_s)},
    )


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _param(location: tuple) -> str | None:
    """OpenAI's ``param`` from pydantic's error location: field names and list indexes, without the
    union members pydantic tried (``prompt.function-after[...]`` -> ``prompt``)."""
    out = ""
    for part in location:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "body" and part.isidentifier():
            out += f".{part}" if out else part
    return out or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0] if exc.errors() else {}
    param = _param(tuple(first.get("loc", ())))
    return f"{param or 'body'}: {first.get('msg', 'invalid request')}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            error_body(exc.message, exc.kind, exc.param), status_code=exc.status, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)  # 400, as OpenAI answers an invalid body (not 422)
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    async def redis_unreachable(request: Request, exc: Exception) -> JSONResponse:
        retry_after = request.app.state.gateway.settings.retry_after_s
        return await api_error(request, queue_unreachable(type(exc).__name__, retry_after))

    for kind in TRANSIENT_ERRORS:  # any endpoint: a Redis outage is a 503, never a 500
        app.add_exception_handler(kind, redis_unreachable)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), status_code=exc.status_code)
