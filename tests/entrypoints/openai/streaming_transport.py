"""An httpx transport that runs an ASGI app in process and streams its body.

httpx's own ASGITransport collects the whole body before returning, so it
cannot show chunks arriving or a client leaving. This one runs the app as a
task, hands body chunks over as they are sent, and on ``response.aclose()``
before the end sends ``http.disconnect`` and drops what the app sends after
it (ASGI spec 2.3, as uvicorn does).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx


class _Body(httpx.AsyncByteStream):
    def __init__(self, queue: asyncio.Queue, disconnected: asyncio.Event, task: asyncio.Task) -> None:
        self.queue, self.disconnected, self.task = queue, disconnected, task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.queue.get()
            if chunk is None:
                return
            yield chunk

    async def aclose(self) -> None:
        self.disconnected.set()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), 30)
        except Exception:  # the app's own error was reported through the response already
            pass


class StreamingASGITransport(httpx.AsyncBaseTransport):
    def __init__(self, app: Any) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        queue: asyncio.Queue = asyncio.Queue()
        disconnected = asyncio.Event()
        start: asyncio.Future = asyncio.get_running_loop().create_future()
        body_sent = False
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": request.method, "scheme": request.url.scheme, "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0], "query_string": request.url.query,
            "headers": [(k.lower(), v) for k, v in request.headers.raw], "server": ("fd", 80),
            "client": ("127.0.0.1", 1234), "root_path": "",
        }

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if disconnected.is_set():
                return  # as uvicorn does: nobody is listening
            if message["type"] == "http.response.start":
                start.set_result(message)
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    queue.put_nowait(message["body"])
                if not message.get("more_body", False):
                    queue.put_nowait(None)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                queue.put_nowait(None)

        task = asyncio.create_task(run())
        try:
            await asyncio.wait([start, task], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the caller gave up before the answer: hang up
            disconnected.set()
            raise
        if not start.done():
            task.result()  # raises the app's error
            raise RuntimeError("the app returned without starting a response")
        message = start.result()
        return httpx.Response(message["status"], headers=message.get("headers", []),
                              stream=_Body(queue, disconnected, task), request=request)
