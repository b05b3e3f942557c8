"""The taking side of an instance: queued requests, its own or stolen, run on its engine.

``Executor.run`` (started by ``GlobalSchedulerClient.start``) keeps the
engine supplied while it has room (``capacity`` requests at once, the
engine's ``--max-num-seqs``): first from its own queue in Redis, else, as
FastDeploy's global scheduler, by stealing the oldest ticket of the most
loaded other queue holding at least ``--scheduler-min-load-score`` tickets
(any queue of an instance whose heartbeat is gone). A take is one Lua script
(``store._TAKE``), so a ticket is never taken twice. Outputs go to the
accepting instance: straight to its waiter when that is this instance,
else appended to its results list in Redis; an abort there stops the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from fd_core.cluster.store import RedisStore
from fd_core.cluster.wire import Result, decode_request, encode_error, encode_output
from fd_core.engine.client import EngineClient, EngineDeadError, RequestError

__all__ = ["Executor"]

logger = logging.getLogger("fd_core.cluster")
IDLE_POLL_SECONDS = 0.05  # an idle instance looks for work this often (its own arrivals wake it at once)

# the accepting side of this same instance: (ticket, result) -> still wanted?
LocalSink = Callable[[str, Result], bool]


class Executor:
    """Takes tickets from Redis and runs them on ``engine``."""

    def __init__(self, store: RedisStore, engine: EngineClient, capacity: int, local: LocalSink) -> None:
        self.store = store
        self.engine = engine
        self.capacity = max(1, capacity)
        self.local = local
        self.wake = asyncio.Event()  # set when this instance queued a request, or a slot freed
        self.running: dict[str, asyncio.Task] = {}  # ticket -> its run
        self.taking = True  # False once shutting down: run what is here, take nothing new
        self.stopped = False  # set by stop: run returns
        self.num_taken = 0
        self.num_stolen = 0

    async def run(self) -> None:
        """Take and start work until cancelled or ``stop``ped."""
        while not self.stopped:
            if not self.taking or len(self.running) >= self.capacity:
                await self._wait(None)
                continue
            got = await self._take_one()
            if got is None:
                await self._wait(IDLE_POLL_SECONDS)
                continue
            ticket, origin, body = got
            self.running[ticket] = asyncio.create_task(self._execute(ticket, origin, body))

    async def _wait(self, timeout: float | None) -> None:
        """Until ``wake`` is set or ``timeout`` passes. Not ``asyncio.wait_for``: before Python
        3.12 it returns normally when a cancel arrives just as the event is set, and ``run``
        then waited forever on a shutdown (issue 18: the shutdown hang)."""
        self.wake.clear()
        waiter = asyncio.ensure_future(self.wake.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()

    async def _take_one(self) -> tuple[str, str, bytes] | None:
        store = self.store
        got = await store.retry("take", lambda: store.take(store.name))
        if got is None:
            victim = await store.retry("look for work", self._pick_victim)
            if victim is not None:
                got = await store.retry("steal", lambda: store.take(victim))
                if got is not None:
                    self.num_stolen += 1
                    logger.info("took %s from %s's queue (accepted by %s)", got[0], victim, got[1])
        if got is not None:
            self.num_taken += 1
        return got

    async def _pick_victim(self) -> str | None:
        """The other instance with the longest queue that may be stolen from."""
        others = [n for n in await self.store.members() if n != self.store.name]
        if not others:
            return None
        lengths = await self.store.queue_lengths(others)
        alive = await self.store.alive(others)
        best, best_len = None, 0
        for name in others:
            length = lengths[name]
            if not alive[name]:
                if length == 0:
                    await self.store.forget(name)
                    continue
            elif length < max(self.store.config.min_load_score, 1):
                continue
            if length > best_len:
                best, best_len = name, length
        return best

    async def _execute(self, ticket: str, origin: str, body: bytes) -> None:
        """Run one ticket and hand its outputs to ``origin``."""
        seq = 0
        try:
            if not await self._deliver(origin, ticket, Result("started", ticket, executor=self.store.name)):
                return
            prompt, params, arrival_time = decode_request(body)
            async for out in self.engine.generate(ticket, prompt, params, arrival_time):
                if not await self._deliver(origin, ticket, Result("output", ticket, seq, output=out)):
                    logger.info("%s was aborted by %s; stopping it", ticket, origin)
                    return  # leaving the loop closes the stream, which aborts it in the engine
                seq += 1
        except asyncio.CancelledError:
            raise
        except RequestError as exc:
            await self._deliver(origin, ticket, Result("error", ticket, seq, error_kind="request", message=str(exc)))
        except Exception as exc:  # the engine failed (or is shutting down): the accepting side decides
            kind = "engine" if isinstance(exc, EngineDeadError) else type(exc).__name__
            message = f"instance {self.store.name} could not finish it: {kind}: {exc}"
            await self._deliver(origin, ticket, Result("error", ticket, seq, error_kind="engine", message=message))
        finally:
            self.running.pop(ticket, None)
            self.wake.set()
            try:
                await self.store.retry("finish", lambda: self.store.finish(ticket))
            except asyncio.CancelledError:
                pass

    async def _deliver(self, origin: str, ticket: str, result: Result) -> bool:
        """Hand a result to the accepting instance; False if it no longer wants the ticket."""
        if origin == self.store.name:
            return self.local(ticket, result)
        if result.kind == "started":  # the take script wrote the mark into Redis already
            return True
        if result.kind == "output":
            entry = encode_output(ticket, result.seq, result.output)
        else:
            entry = encode_error(ticket, result.seq, result.error_kind, result.message)
        return await self.store.retry("return a result",
                                      lambda: self.store.push_result(origin, ticket, entry))

    async def stop(self) -> None:
        """Take nothing more and cancel what runs (the accepting sides re-queue or fail it)."""
        self.taking = False
        self.stopped = True
        self.wake.set()
        for task in list(self.running.values()):
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
