"""``wait_within``: results, timeouts, and a cancel that is never swallowed."""

from __future__ import annotations

import asyncio

import pytest

from fd_core.entrypoints.aio import wait_within


def test_the_result_comes_back_and_a_timeout_cancels_the_awaitable():
    async def main() -> None:
        assert await wait_within(asyncio.sleep(0, result=7), 1.0) == 7
        assert await wait_within(asyncio.sleep(0, result=8), None) == 8
        cancelled = asyncio.Event()

        async def slow() -> None:
            try:
                await asyncio.sleep(10)
            finally:
                cancelled.set()
        with pytest.raises(asyncio.TimeoutError):
            await wait_within(slow(), 0.01)
        assert cancelled.is_set()  # finished before wait_within returned
    asyncio.run(main())


def test_an_error_of_the_awaitable_propagates():
    async def fails() -> None:
        raise ValueError("boom")

    async def main() -> None:
        with pytest.raises(ValueError, match="boom"):
            await wait_within(fails(), 1.0)
    asyncio.run(main())


def test_a_cancel_that_arrives_as_the_awaitable_finishes_is_raised():
    """The race behind Python 3.11's wait_for: the event is set and the waiter cancelled in the
    same loop iteration. wait_within must raise CancelledError, not return."""
    async def main() -> str:
        event = asyncio.Event()

        async def waiter() -> str:
            await wait_within(event.wait(), 5.0)
            return "returned"
        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0.01)  # the waiter is parked on the event
        event.set()
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"
    assert asyncio.run(main()) == "cancelled"
