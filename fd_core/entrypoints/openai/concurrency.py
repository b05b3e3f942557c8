"""``--max-concurrency``: the engine requests a server has in flight, counted.

A generation request takes one slot when its body has arrived (the
middleware; over the limit it is answered 429 at once). Once the handler
knows how many engine requests it fans out to (``n`` samples, or prompts x
``n``/``best_of`` for completions) it widens its hold to that many with
``reserve``: 429 when the other requests in flight leave too few slots, 400
when the request alone needs more than the whole limit (it could never be
served). Every slot is given back when the answer's last byte is sent or
the client goes away.

The hold of the request being served travels in a context variable, so the
handlers need no handle on the middleware.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from fd_core.entrypoints.openai.errors import OpenAIError, error_response

__all__ = ["ConcurrencyLimit", "ConcurrencyLimitMiddleware", "reserve"]

RETRY_AFTER = {"Retry-After": "1"}


@dataclass
class _Hold:
    limit: ConcurrencyLimit
    slots: int = 1


_current: contextvars.ContextVar[_Hold | None] = contextvars.ContextVar("fd_concurrency_hold", default=None)


@dataclass
class ConcurrencyLimit:
    """The count of engine requests in flight against ``limit``."""

    limit: int
    in_flight: int = 0

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.limit}")


def reserve(sequences: int, field: str) -> None:
    """Widen the current request's hold to ``sequences`` engine requests.

    A no-op outside a limited server (offline, or no ``--max-concurrency``).
    Raises OpenAIError: 400 naming ``field`` when ``sequences`` exceeds the
    limit itself, 429 when the requests already in flight leave too few."""
    hold = _current.get()
    if hold is None or sequences <= hold.slots:
        return
    limit = hold.limit
    if sequences > limit.limit:
        raise OpenAIError(
            f"This request fans out to {sequences} sequences ({field}) but the server serves at most "
            f"{limit.limit} at once (--max-concurrency); ask for fewer", 400, field)
    extra = sequences - hold.slots
    if limit.in_flight + extra > limit.limit:
        raise OpenAIError(
            f"Too many requests: {limit.in_flight} sequences are in flight and this request needs "
            f"{sequences} of at most {limit.limit} (--max-concurrency); retry later", 429, headers=RETRY_AFTER)
    limit.in_flight += extra
    hold.slots = sequences


class ConcurrencyLimitMiddleware:
    """429 at once for a generation request when ``limit`` is full; otherwise one
    slot, widened by the handler (``reserve``), held until the answer ends."""

    def __init__(self, app: ASGIApp, limit: ConcurrencyLimit, paths: tuple[str, ...]) -> None:
        self.app = app
        self.limit = limit
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        limit = self.limit
        if limit.in_flight >= limit.limit:
            response = error_response(
                f"Too many requests: {limit.in_flight} sequences are in flight and this server takes at most "
                f"{limit.limit} (--max-concurrency); retry later", 429, headers=RETRY_AFTER)
            await response(scope, receive, send)
            return
        hold = _Hold(limit)
        limit.in_flight += 1
        token = _current.set(hold)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)
            limit.in_flight -= hold.slots
