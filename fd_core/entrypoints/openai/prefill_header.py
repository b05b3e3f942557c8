"""``x-fd-prefill-addr: host:port``: the prefill instance a router chose.

A decode instance (``--splitwise-role decode``) sends the request's prompt to
that prefill instance instead of choosing one of ``--innode-prefill-ports``
by load. The middleware puts the header's value in
``fd_core.engine.frontend.PREFILL_ADDR`` for the request being served; the
frontend copies it into each ``EngineCoreRequest.prefill_addr``. A value that
is not ``host:port`` is answered 400. Other roles ignore the header.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from fd_core.engine.frontend import PREFILL_ADDR
from fd_core.entrypoints.openai.errors import error_response

__all__ = ["HEADER", "PrefillAddrMiddleware"]

HEADER = b"x-fd-prefill-addr"


def _valid(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


class PrefillAddrMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        value = None
        if scope["type"] == "http":
            value = next((v.decode("latin-1").strip() for k, v in scope["headers"] if k == HEADER), None)
        if value is None:
            await self.app(scope, receive, send)
            return
        if not _valid(value):
            response = error_response(f"x-fd-prefill-addr must be host:port (a prefill instance), got {value!r}",
                                      400, "x-fd-prefill-addr")
            await response(scope, receive, send)
            return
        token = PREFILL_ADDR.set(value)
        try:
            await self.app(scope, receive, send)
        finally:
            PREFILL_ADDR.reset(token)
