"""The two endpoints that carry the load (``POST /v1/completions`` and ``/v1/chat/completions``), served
without FastAPI's per-request machinery: no dependency solving, no request model built from a parsed dict
and no response model validated again before it is encoded. The body is parsed and validated in one step
by pydantic's JSON parser, the answer encoded by pydantic's serializer. Everything else (the checks, the
queue, the stream, the errors) is the routes' own code; FastAPI keeps the routes, which describe the
endpoints in the OpenAPI document.
"""

from __future__ import annotations

import json
import logging

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine_pod.queue.resilience import TRANSIENT_ERRORS
from gateway.errors import ApiError, error_body, queue_unreachable, validation_error
from gateway.routers.completions import chat, complete
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.state import require_api_key

logger = logging.getLogger(__name__)
ROUTES = {
    "/v1/completions": (CompletionRequest, complete),
    "/v1/chat/completions": (ChatCompletionRequest, chat),
}


def is_hot(scope) -> bool:
    """Whether the request is one of the two endpoints answered here."""
    return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ROUTES


class FastPath:
    """Pure ASGI application answering the two endpoints (``is_hot`` requests only; the gateway's
    ``HotPath`` sends it nothing else)."""

    async def __call__(self, scope, receive, send) -> None:
        scope["route"] = _RouteLabel(scope["path"])  # what the request counter labels its series with
        try:
            response = await _answer(Request(scope, receive), *ROUTES[scope["path"]])
        except Exception:  # noqa: BLE001 - a bug answered as OpenAI answers one, and logged
            logger.exception("%s failed", scope["path"])
            response = JSONResponse(error_body("the server had an error", "server_error"), status_code=500)
        await response(scope, receive, send)


class _RouteLabel:
    def __init__(self, path: str) -> None:
        self.path = path


async def _answer(request: Request, model: type[BaseModel], handler) -> Response:
    state = request.app.state.gateway
    try:
        await require_api_key(request, state)
        body = _parsed(model, await request.body())
        result = await handler(body, state, request.is_disconnected)
    except ApiError as exc:
        return _error(exc)
    except ValidationError as exc:
        return _error(validation_error(exc.errors()))
    except HTTPException as exc:  # a body over the limit, met while it was read
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), status_code=exc.status_code)
    except TRANSIENT_ERRORS as exc:
        return _error(queue_unreachable(type(exc).__name__, state.settings.retry_after_s))
    if isinstance(result, BaseModel):
        return Response(result.model_dump_json(), media_type="application/json")
    return result  # a stream


def _parsed(model: type[BaseModel], raw: bytes) -> BaseModel:
    """The body, parsed and validated in one step; where the JSON parser refuses it, parsed again by
    Python's, which reads what is valid JSON but not text (a lone surrogate) and lets the model name the
    field, or says where the JSON is broken."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        if exc.errors()[0]["type"] != "json_invalid":
            raise
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError) as broken:  # JSONDecodeError, UnicodeDecodeError, too deep
        where = (
            f"{broken.msg} at character {broken.pos}"
            if isinstance(broken, json.JSONDecodeError)
            else "not UTF-8 JSON"
        )
        raise ApiError(
            400,
            f"the request body is not valid JSON ({where}); send one JSON object with Content-Type: "
            "application/json",
        ) from None
    return model.model_validate(parsed)


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
