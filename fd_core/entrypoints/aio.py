"""``wait_within``: ``asyncio.wait_for`` without Python 3.11's swallowed cancel.

Before Python 3.12, ``asyncio.wait_for`` returns the result normally when a
cancel arrives just as the awaited thing finishes; the caller then goes on as
if it had not been cancelled (issue 18's shutdown hang came from it). The
server's waits with a deadline (``Drain.wait_idle``, the first output under
``--max-waiting-time``) use this instead: a cancel always propagates, and the
awaited task is cancelled with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["wait_within"]

T = TypeVar("T")


async def wait_within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """``awaitable``'s result; ``asyncio.TimeoutError`` after ``timeout`` seconds (None: no limit),
    the awaitable then cancelled and finished before this returns. A cancel of the caller cancels
    the awaitable too and is raised, never swallowed."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:  # it failed while being cancelled: the timeout is the answer
            pass
        raise asyncio.TimeoutError
    return task.result()
