"""The executor's loop without Redis: it stops when cancelled, whenever the cancel comes."""

from __future__ import annotations

import asyncio

import pytest

from fd_core.cluster.executor import Executor
from tests.cluster.fake_engine import FakeEngine


class _EmptyStore:
    """A store with no work anywhere (what ``Executor.run`` calls of it)."""

    name = "a"

    async def retry(self, what, call):
        return await call()

    async def take(self, victim):
        return None

    async def members(self):
        return [self.name]


async def _idle_executor() -> tuple[Executor, asyncio.Task]:
    executor = Executor(_EmptyStore(), FakeEngine(), 1, lambda ticket, result: True)  # type: ignore[arg-type]
    task = asyncio.get_running_loop().create_task(executor.run())
    await asyncio.sleep(0.01)  # it found nothing and waits for work
    return executor, task


def test_a_cancel_that_arrives_as_the_executor_is_woken_stops_it():
    # the shutdown hang of issue 18: a slot freed (wake set) and the cancel came in the same
    # loop iteration; asyncio.wait_for (Python < 3.12) swallowed the cancel and the loop waited
    # forever for a wake-up that never came
    async def main() -> None:
        executor, task = await _idle_executor()
        executor.taking = False  # abort_all: take nothing new
        executor.wake.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)

    asyncio.run(main())


def test_stop_ends_the_loop_even_without_a_cancel():
    async def main() -> None:
        executor, task = await _idle_executor()
        await executor.stop()
        await asyncio.wait_for(task, 5)
        assert task.done() and not task.cancelled()

    asyncio.run(main())
