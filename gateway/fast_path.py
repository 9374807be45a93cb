"""The two endpoints that carry the load (``POST /v1/completions`` and ``/v1/chat/completions``), served
without FastAPI's per-request machinery: no dependency solving, no request model built from a parsed dict
and no response model validated again before it is encoded. The body is parsed and validated in one step
by pydantic's JSON parser, the answer encoded by pydantic's serializer. Everything else (the checks, the
queue, the stream, the errors) is the routes' own code; FastAPI keeps the routes, which describe the
endpoints in the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import json
import logging

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from dllm_contracts.queue.resilience import TRANSIENT_ERRORS
from gateway.errors import (
    ApiError,
    from_http_exception,
    queue_unreachable,
    server_error,
    shutting_down,
    validation_error,
)
from gateway.rate_limits import Admitted
from gateway.routers.completions import chat, complete
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.state import authorization_of, check_api_key

logger = logging.getLogger(__name__)
CLIENT_LEFT = 499  # the status a request whose client left before its answer is counted with (nginx's)
ROUTES = {
    "/v1/completions": (CompletionRequest, complete),
    "/v1/chat/completions": (ChatCompletionRequest, chat),
}


def is_hot(scope) -> bool:
    """Whether the request is one of the two endpoints answered here."""
    return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ROUTES


class FastPath:
    """Pure ASGI application answering the two endpoints (``is_hot`` requests only; the gateway's
    ``HotPath`` sends it nothing else): the one door those requests come in by."""

    async def __call__(self, scope, receive, send) -> None:
        scope["route"] = _RouteLabel(scope["path"])  # what the request counter labels its series with
        request = Request(scope, receive)
        state = request.app.state.gateway
        try:
            response = await respond(
                state, scope["path"], scope["headers"], request.body, request.is_disconnected
            )
        except ClientDisconnect:  # it left before its answer (in the middle of its body, say): no one to tell
            state.metrics.count_request(scope["path"], CLIENT_LEFT)
            return
        except asyncio.CancelledError:  # the server's drain ran out: the client is told to retry
            _uncancel()
            response = shutting_down(state.settings.retry_after_s).response()
        await response(scope, receive, send)


def _uncancel() -> None:
    """The current task's cancellation handled (Python 3.11+ counts them)."""
    uncancel = getattr(asyncio.current_task(), "uncancel", None)
    if uncancel is not None:
        uncancel()


class _RouteLabel:
    def __init__(self, path: str) -> None:
        self.path = path


async def respond(state, path: str, headers, read_body, is_disconnected) -> Response:
    """The answer to a request for one of the two endpoints: a whole JSON response, or a stream of events
    (a ``StreamingResponse``). ``headers``: the request's (ASGI's list of pairs); ``read_body``: awaited
    for the body, after the key is checked. A bug is answered as OpenAI answers one (500,
    ``server_error``), and logged; a client that left raises ``ClientDisconnect``."""
    try:
        return await _answer(state, path, headers, read_body, is_disconnected)
    except ClientDisconnect:
        raise
    except Exception:  # noqa: BLE001
        logger.exception("%s failed", path)
        return server_error().response()


async def _answer(state, path: str, headers, read_body, is_disconnected) -> Response:
    """The answer, with the caller's rate limit headers; the caller's hold on its limits ends with the
    answer (a whole one), with the stream (a stream), or with the error."""
    admitted = None
    try:
        admitted = Admitted(check_api_key(state, authorization_of(headers)))
        response = await _handled(state, path, admitted, read_body, is_disconnected)
    except ApiError as exc:
        response = exc.response()
    except BaseException:
        if admitted is not None:
            await admitted.end(state)
        raise
    if admitted is not None:
        response.headers.update(admitted.headers())
        if isinstance(response, StreamingResponse):
            response.body_iterator = _ending(response.body_iterator, admitted, state)
        else:
            await admitted.end(state)
    return response


async def _ending(body, admitted: Admitted, state):
    """A stream's body that ends the caller's hold when it ends (sent, failed, or its client left)."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        await admitted.end(state)


async def _handled(state, path: str, admitted: Admitted, read_body, is_disconnected) -> Response:
    model, handler = ROUTES[path]
    try:
        body = _parsed(model, await read_body())
        result = await handler(body, state, is_disconnected, admitted)
    except ApiError as exc:
        return exc.response()
    except ValidationError as exc:
        return validation_error(exc.errors()).response()
    except HTTPException as exc:  # a body over the limit, met while it was read
        return from_http_exception("POST", path, exc).response()
    except TRANSIENT_ERRORS as exc:
        return queue_unreachable(type(exc).__name__, state.settings.retry_after_s).response()
    if isinstance(result, BaseModel):
        admitted.generated = result.usage.completion_tokens
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
