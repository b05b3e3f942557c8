"""Request bodies arrive whole, in time and within a size, before anything counts them.

``BodyLimitMiddleware`` reads the body of every POST itself: beyond
``max_bytes`` (``--max-request-body-bytes``; a declared Content-Length is
checked before reading) the answer is 413; a body that has not fully arrived
``timeout`` seconds after the request started gets 408 and the connection is
closed. Only then is the request handed on, its body replayed, so the
concurrency limit inside counts requests that can be served, never half-read
uploads (512 stalled uploads used to make every later request a 429).
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fd_core.entrypoints.openai.errors import error_response

__all__ = ["BODY_TIMEOUT_SECONDS", "BodyLimitMiddleware", "default_max_body_bytes"]

BODY_TIMEOUT_SECONDS = 30.0
MIB = 1 << 20


def default_max_body_bytes(max_model_len: int) -> int:
    """16 MiB plus 64 bytes a token of the longest prompt: a prompt of max_model_len
    tokens fits as text (JSON-escaped) or as token ids, with room for messages and tools."""
    return 16 * MIB + 64 * max_model_len


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float = BODY_TIMEOUT_SECONDS) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                response = error_response(
                    f"The request body did not arrive within {self.timeout:g} s", 408,
                    headers={"Connection": "close"})
                await response(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the real channel: a disconnect still reaches the handler

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            f"The request body is larger than {self.max_bytes} bytes (--max-request-body-bytes)", 413,
            headers={"Connection": "close"})
        await response(scope, receive, send)
