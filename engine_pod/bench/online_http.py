"""Drive an OpenAI-compatible server (ours in-process, or ``dllm serve`` at a URL) with an online load,
streaming each request so that the time to its first committed block is seen as a client sees it."""

from __future__ import annotations

import asyncio
import time

from engine_pod.bench.http_client import HttpError, LoadClient
from engine_pod.bench.online import Load, Observed, OnlineRequest

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class ServerError(ValueError):
    """The server at --url cannot be loaded: unreachable, or it refused (one line for the user)."""


def served_model(url: str, api_key: str | None, model: str | None) -> str:
    """The model to ask ``url`` for: ``model`` if it serves it, else the one it serves (``/v1/models``)."""
    try:
        listed = asyncio.run(LoadClient(url, api_key).get_json("/v1/models"))
    except HttpError as exc:
        raise ServerError(f"{url}/v1/models: {exc}") from None
    except OSError as exc:
        raise ServerError(f"cannot reach {url}: {exc.strerror or exc}") from None
    ids = [entry["id"] for entry in listed.get("data", [])]
    if model is None and len(ids) == 1:
        return ids[0]
    if model is None or model not in ids:
        wanted = f"does not serve {model!r}" if model else "serves several models"
        raise ServerError(f"{url} {wanted}; it serves {', '.join(ids) or 'none'} (--served-model-name)")
    return model


def _body(item: OnlineRequest, model: str, chat: bool) -> dict:
    body = {
        "model": model,
        "max_tokens": item.request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        return body | {"messages": [{"role": "user", "content": item.prompt or ""}]}
    return body | {"prompt": item.request.prompt_ids}


def _has_text(chunk: dict) -> bool:
    for choice in chunk.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


async def _one(client: LoadClient, item: OnlineRequest, model: str, chat: bool, start: float) -> Observed:
    sent = time.perf_counter() - start
    first, tokens = None, 0
    async for chunk in client.post_events(CHAT_PATH if chat else COMPLETIONS_PATH, _body(item, model, chat)):
        if first is None and _has_text(chunk):
            first = time.perf_counter() - start
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    return Observed(item.family, sent, time.perf_counter() - start, first, tokens)


async def drive(
    url: str, requests: list[OnlineRequest], load: Load, model: str, chat: bool, api_key: str | None = None
) -> list[Observed]:
    """Every request of ``requests`` under ``load``; chat sends each prompt as a user message, otherwise
    the prompt's token ids go to the completions endpoint."""
    client, start = LoadClient(url, api_key), time.perf_counter()
    if load.rate is not None:

        async def at(offset: float, item: OnlineRequest) -> Observed:
            await asyncio.sleep(max(0.0, offset - (time.perf_counter() - start)))
            return await _one(client, item, model, chat, start)

        offsets = load.arrival_offsets(len(requests))
        return list(await asyncio.gather(*(at(o, item) for o, item in zip(offsets, requests))))
    queue = list(requests)
    observed: list[Observed] = []

    async def user() -> None:
        while queue:
            observed.append(await _one(client, queue.pop(0), model, chat, start))

    await asyncio.gather(*(user() for _ in range(load.concurrency)))
    return observed
