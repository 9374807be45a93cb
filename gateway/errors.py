"""OpenAI-style error bodies: every 4xx says what was wrong in one sentence."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dllm_contracts.queue.resilience import TRANSIENT_ERRORS


class ApiError(Exception):
    """An answer in OpenAI's error shape: status, message, ``type`` (kind), ``param`` and ``code`` (what
    OpenAI fills for the same case: ``invalid_api_key``, ``model_not_found``, ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.headers, self.code = headers or {}, code

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def queue_unreachable(what: str, retry_after_s: int) -> ApiError:
    """503 with Retry-After: Redis cannot be reached right now (never a 500)."""
    return ApiError(
        503,
        f"{what}: the queue is unreachable; retry later",
        "server_error",
        headers={"Retry-After": str(retry_after_s)},
    )


def shutting_down(retry_after_s: int) -> ApiError:
    """503 with Retry-After: the gateway is stopping and will not answer this request."""
    return ApiError(
        503,
        "the gateway is shutting down; retry the request",
        "server_error",
        headers={"Retry-After": str(retry_after_s)},
    )


def model_not_found(model: str, served: str) -> ApiError:
    """404 for a model this service does not serve (a request's ``model``, or ``GET /v1/models/{id}``)."""
    return ApiError(
        404,
        f"the model {model!r} does not exist; this service serves {served!r}",
        param="model",
        code="model_not_found",
    )


def server_error() -> ApiError:
    """500 as OpenAI answers a bug on its side (the bug itself is logged where it was caught)."""
    return ApiError(500, "the server had an error", "server_error")


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


_UNION_MEMBERS = {"str", "int", "float", "bool", "none", "list", "dict", "tuple", "bytes"}


def _param(location: tuple) -> str | None:
    """OpenAI's ``param`` from pydantic's error location: field names and list indexes, without the
    union members pydantic tried (``prompt.function-after[...]``, ``presence_penalty.float``,
    ``stream_options.StreamOptions`` -> the field). Field names are lowercase identifiers."""
    out = ""
    for part in location:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "body" and part.isidentifier() and part.islower() and part not in _UNION_MEMBERS:
            out += f".{part}" if out else part
    return out or None


_CODES = {  # pydantic's error type -> the code OpenAI gives the same mistake
    "missing": "missing_required_parameter",
    "extra_forbidden": "unknown_parameter",
    "literal_error": "invalid_value",
    "enum": "invalid_value",
    "too_long": "array_above_max_length",
    "too_short": "array_below_min_length",
}
_BOUNDS = {"greater_than": "below_min", "greater_than_equal": "below_min"}
_BOUNDS |= {"less_than": "above_max", "less_than_equal": "above_max"}


def _code(error: dict) -> str | None:
    kind = error.get("type", "")
    if kind in _BOUNDS:  # a bound written as a float is a number field's, an int an integer field's
        bounds = list((error.get("ctx") or {}).values())
        number = "decimal" if any(isinstance(b, float) for b in bounds) else "integer"
        return f"{number}_{_BOUNDS[kind]}_value"
    if kind.endswith(("_type", "_parsing")):
        return "invalid_type"
    return _CODES.get(kind, kind if kind.startswith("unsupported_") else None)


def validation_error(errors: list[dict]) -> ApiError:
    """A 400 (as OpenAI answers an invalid body, not FastAPI's 422) for the first of pydantic's errors."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "invalid JSON")
        position = (first.get("loc") or (None,))[-1]
        where = f" at character {position}" if isinstance(position, int) else ""
        return ApiError(
            400,
            f"the request body is not valid JSON ({reason}{where}); send one JSON object "
            "with Content-Type: application/json",
        )
    param = _param(tuple(first.get("loc", ())))
    first = _most_telling(errors, param) or first
    message = f"{param or 'body'}: {first.get('msg', 'invalid request')}"
    return ApiError(400, message, param=param, code=_code(first))


def _most_telling(errors: list[dict], param: str | None) -> dict | None:
    """Of a union's errors on ``param`` (one per member pydantic tried), the first that is not a type
    mismatch: a list of five stops says "at most 4 items", not "not a string"."""
    same = [e for e in errors if _param(tuple(e.get("loc", ()))) == param]
    return next((e for e in same if not e.get("type", "").endswith("_type")), None)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await api_error(request, validation_error(exc.errors()))

    async def redis_unreachable(request: Request, exc: Exception) -> JSONResponse:
        retry_after = request.app.state.gateway.settings.retry_after_s
        return await api_error(request, queue_unreachable(type(exc).__name__, retry_after))

    for kind in TRANSIENT_ERRORS:  # any endpoint: a Redis outage is a 503, never a 500
        app.add_exception_handler(kind, redis_unreachable)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return from_http_exception(request.method, request.url.path, exc).response()

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:  # logged by the server, as raised
        return server_error().response()


def from_http_exception(method: str, path: str, exc: StarletteHTTPException) -> ApiError:
    """Starlette's errors in OpenAI's shape: a URL no route serves (404, ``unknown_url``), a method its
    route does not take (405, with the methods it takes in ``Allow``), any other with its own message."""
    headers = dict(exc.headers or {})
    if exc.status_code == 404 and exc.detail == "Not Found":  # the router's (handlers raise ApiError)
        return ApiError(404, unknown_url(method, path), code="unknown_url", headers=headers)
    if exc.status_code == 405:
        allowed = headers.get("Allow") or headers.get("allow")
        takes = f"; it takes {allowed}" if allowed else ""
        message = f"Invalid method for URL ({method} {path}){takes}."
        return ApiError(405, message, code="method_not_allowed", headers=headers)
    return ApiError(exc.status_code, str(exc.detail), headers=headers)


def unknown_url(method: str, path: str) -> str:
    return (
        f"Unknown request URL: {method} {path}. Please check the URL for typos; this service serves "
        "OpenAI's /v1/completions, /v1/chat/completions, /v1/models, /v1/files and /v1/batches."
    )
