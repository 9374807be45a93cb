"""Server-sent events sent without Starlette's per-stream task group.

Starlette's ``StreamingResponse`` (under an ASGI server older than spec 2.4, as uvicorn is) runs the body
in an anyio task group beside a task that waits for the client to leave: about a third of a streamed
request's CPU in the gateway (py-spy). Here the body is sent from the request's own task and one plain
asyncio task waits for the disconnect; when the client leaves, it cancels the sending task (the stream's
generator is closed, which cancels its requests, as before).
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse


class EventStream(StreamingResponse):
    async def __call__(self, scope, receive, send) -> None:
        sending = asyncio.current_task()
        left = False

        async def watch() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            sending.cancel()

        watcher = asyncio.create_task(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not left:  # cancelled from outside (a shutdown): not ours to swallow
                raise
            uncancel = getattr(sending, "uncancel", None)  # Python 3.11+: the cancellation is handled
            if uncancel is not None:
                uncancel()
        finally:
            watcher.cancel()
        if self.background is not None and not left:
            await self.background()
