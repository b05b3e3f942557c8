"""``GlobalSchedulerClient``: the engine client of an instance under ``--scheduler-name global``.

It wraps the instance's own ``EngineClient`` (the engine never knows) and
gives the API server the same interface. ``generate`` queues the request in
Redis under this instance's name and streams its results back, whichever
instance's ``Executor`` ran it. Background tasks (``start``):

- the heartbeat: this instance's live load (running, waiting, free KV blocks,
  queued) under a key that expires after ``--scheduler-expire-period``;
- the results reader: this instance's results list in Redis;
- the watchdog: a request whose executing instance's heartbeat is gone, or
  whose engine failed, is queued again as a new attempt if it has streamed
  nothing yet, else fails with an error naming the instance (never a hang);
  after a Redis restart that lost data, requests not yet started are queued
  again and a request whose results have a gap fails;
- the executor (``executor.py``).

A request is acknowledged once Redis has it (the submit is retried until
then); each attempt has its own ticket, and only the first attempt that
reports back is followed (the others are aborted).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fd_core.cluster.config import GlobalSchedulerConfig
from fd_core.cluster.executor import Executor
from fd_core.cluster.store import RedisStore
from fd_core.cluster.wire import Result, decode_result, encode_request, request_id_of, ticket_of
from fd_core.engine.client import EngineClient, EngineDeadError, EngineStats, RequestError, admit
from fd_core.engine.outputs import RequestOutput
from fd_core.sampling.params import SamplingParams

__all__ = ["GlobalSchedulerClient", "InstanceLostError", "MAX_ATTEMPTS"]

logger = logging.getLogger("fd_core.cluster")
MAX_ATTEMPTS = 3  # a request that has streamed nothing is queued again at most this often


class InstanceLostError(EngineDeadError):
    """The instance running a request stopped after it had streamed part of it."""


@dataclass
class _Pending:
    """A request this instance accepted, until its last output."""

    request_id: str
    body: bytes
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    attempt: int = 1
    dropped: set[int] = field(default_factory=set)  # attempts given up (aborted in Redis)
    executor: str | None = None  # the instance running the current attempt, once it said so
    next_seq: int = 0  # of the current attempt's results
    num_outputs: int = 0  # outputs handed to the waiter (all attempts)
    acked: bool = False  # Redis acknowledged the current attempt's submit

    @property
    def ticket(self) -> str:
        return ticket_of(self.request_id, self.attempt)


class GlobalSchedulerClient(EngineClient):
    """An ``EngineClient`` that schedules through Redis; anything else goes to ``inner``."""

    def __init__(self, inner: EngineClient, config: GlobalSchedulerConfig, default_name: str | None = None,
                 capacity: int | None = None, url: str | None = None) -> None:
        """``capacity``: requests this instance runs at once (default: the engine's --max-num-seqs);
        ``url``: the HTTP address its heartbeat advertises (fd-router's Redis discovery reads it)."""
        self.url = url
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.info = inner.info
        self.config = config
        self.base_name = config.instance_name or default_name or socket.gethostname()
        self.store = RedisStore(config, self.base_name)
        self.executor = Executor(self.store, inner, capacity or inner.info.max_num_seqs or 8, self._local_result)
        self._pending: dict[str, _Pending] = {}
        self._registered = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        self._closing: BaseException | None = None
        self._run_id: str | None = None
        self._restarted_at = 0.0  # loop time of the last Redis restart seen (grace for heartbeats)

    def __getattr__(self, name: str) -> Any:  # process, dead, close, num_in_flight, ...
        return getattr(self.inner, name)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the engine client and the scheduler's tasks (in the running loop)."""
        start = getattr(self.inner, "start", None)
        if start is not None:
            start()
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._heartbeat_loop()), loop.create_task(self._results_loop()),
                           loop.create_task(self._executor_loop())]

    async def shutdown(self) -> None:
        await self.executor.stop()
        for task in [*self._tasks, *self._background]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        try:
            await asyncio.wait_for(self.store.leave(), 2.0)
        except Exception:  # Redis down: the heartbeat expires by itself
            pass
        await self.store.close()
        await self.inner.shutdown()

    async def check_health(self) -> None:
        await self.inner.check_health()

    def stats(self) -> EngineStats:
        return self.inner.stats()

    @property
    def name(self) -> str:
        return self.store.name

    # ------------------------------------------------------------ requests
    async def generate(
        self, request_id: str, prompt: str | list[int] | dict[str, Any], params: SamplingParams,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        await admit(self, request_id, self._pending, self._closing)
        if "#" in request_id:
            raise RequestError(f"request id {request_id!r} may not contain '#'")
        pending = _Pending(request_id, encode_request(prompt, params, arrival_time or time.time()))
        self._pending[request_id] = pending
        finished = False
        try:
            await self._registered.wait()
            await self._submit(pending)
            while True:
                item = await pending.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._pending.pop(request_id, None)
            if not finished:
                self._in_background(self._abort_ticket(pending.ticket))

    async def abort(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.queue.put_nowait(RequestError(f"request {request_id} was aborted"))
            await self._abort_ticket(pending.ticket)

    async def abort_all(self, error: BaseException) -> int:
        """Fail every accepted request with ``error`` and every later one (shutdown)."""
        self._closing = error
        self.executor.taking = False
        count = len(self._pending)
        for pending in list(self._pending.values()):
            pending.queue.put_nowait(error)
        abort_all = getattr(self.inner, "abort_all", None)
        if abort_all is not None:
            await abort_all(error)
        return count

    async def _submit(self, pending: _Pending) -> None:
        pending.acked = False
        await self.store.retry("queue a request", lambda: self.store.submit(pending.ticket, pending.body))
        pending.acked = True
        self.executor.wake.set()

    async def _abort_ticket(self, ticket: str) -> None:
        await self.store.retry("abort a request", lambda: self.store.abort(ticket))

    def _in_background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------ results
    def _local_result(self, ticket: str, result: Result) -> bool:
        """A result of a ticket this instance both accepted and runs."""
        return self._dispatch(result)

    async def _results_loop(self) -> None:
        await self._registered.wait()
        while True:
            entries = await self.store.retry("read results", lambda: self.store.read_results(1.0))
            for entry in entries:
                try:
                    result = decode_result(entry)
                except ValueError as exc:
                    logger.error("dropping a result entry: %s", exc)
                    continue
                if not self._dispatch(result):
                    self._in_background(self._abort_ticket(result.ticket))
            # handled: drop them (read again after a lost reply, they are seen already by seq)
            await self.store.retry("acknowledge results", functools.partial(self.store.ack_results, entries))

    def _dispatch(self, result: Result) -> bool:
        """Hand a result to its waiter; False if nobody wants this ticket any more."""
        request_id, attempt = request_id_of(result.ticket)
        pending = self._pending.get(request_id)
        if pending is None or attempt != pending.attempt or attempt in pending.dropped:
            return False
        if result.kind == "started":
            pending.executor = result.executor
            return True
        if result.seq < pending.next_seq:  # a retried push whose first reply was lost: seen already
            return True
        if result.seq > pending.next_seq:
            self._fail(pending, InstanceLostError(
                f"results of request {request_id} were lost (expected part {pending.next_seq}, got "
                f"{result.seq}; was the Redis server restarted without persistence?); retry the request"))
            return False
        pending.next_seq += 1
        if result.kind == "output":
            output = result.output
            output.request_id = request_id
            pending.num_outputs += 1
            pending.queue.put_nowait(output)
            return True
        if result.error_kind == "request":
            pending.queue.put_nowait(RequestError(result.message))
        else:
            self._retry_or_fail(pending, result.message)
        return False

    def _fail(self, pending: _Pending, error: BaseException) -> None:
        pending.dropped.add(pending.attempt)
        self._in_background(self._abort_ticket(pending.ticket))
        pending.queue.put_nowait(error)

    def _requeue(self, pending: _Pending, why: str) -> None:
        """Give up the current attempt (aborted in Redis) and queue a new one."""
        old = pending.ticket
        pending.dropped.add(pending.attempt)
        pending.attempt += 1
        pending.executor, pending.next_seq = None, 0
        logger.warning("%s: %s; queueing it again (attempt %d)", old, why, pending.attempt)
        self._in_background(self._abort_ticket(old))
        self._in_background(self._submit(pending))

    def _retry_or_fail(self, pending: _Pending, why: str) -> None:
        """Queue a request again as a new attempt if it has streamed nothing, else fail it."""
        if pending.num_outputs == 0 and pending.attempt < MAX_ATTEMPTS:
            self._requeue(pending, why)
            return
        streamed = f" after {pending.num_outputs} output(s) were streamed" if pending.num_outputs else ""
        self._fail(pending, InstanceLostError(f"request {pending.request_id} failed{streamed}: {why}"))

    # ------------------------------------------------------------ heartbeat and watchdog
    async def _register(self) -> None:
        base, n = self.base_name, 1
        while not await self.store.retry("register", self.store.claim_name):
            n += 1
            self.store.name = f"{base}-{n}"
        self._run_id = await self.store.retry("read the server id", self.store.server_run_id)
        logger.info("global scheduler: instance %s joined topic %r on Redis %s:%d", self.store.name,
                    self.config.topic, self.config.host, self.config.port)
        self._registered.set()

    async def _heartbeat_loop(self) -> None:
        await self._register()
        while True:
            await self.store.retry("heartbeat", self._beat)
            await asyncio.sleep(self.config.heartbeat_seconds)

    def load(self) -> dict[str, Any]:
        st = self.inner.stats()
        return {"running": st.num_running, "waiting": st.num_waiting, "free_blocks": st.num_free_blocks,
                "executing": len(self.executor.running), "accepted": len(self._pending),
                "capacity": self.executor.capacity, "taken": self.executor.num_taken,
                "stolen": self.executor.num_stolen, "time": time.time(),
                **({"url": self.url} if self.url else {})}

    async def _beat(self) -> None:
        run_id = await self.store.server_run_id()
        if run_id != self._run_id:
            logger.warning("the Redis server restarted (run id %s -> %s)", self._run_id, run_id)
            self._run_id, self._restarted_at = run_id, asyncio.get_running_loop().time()
            await self._requeue_lost()
        load = self.load()
        load["queued"] = (await self.store.queue_lengths([self.store.name]))[self.store.name]
        await self.store.heartbeat(load)
        if asyncio.get_running_loop().time() - self._restarted_at > self.config.expire_period_ms / 1000:
            await self._watch_executors()

    async def _requeue_lost(self) -> None:
        """After a Redis restart: queue again each request not started whose ticket Redis lost."""
        for pending in list(self._pending.values()):
            if (pending.acked and pending.executor is None and pending.num_outputs == 0
                    and not await self.store.exists(pending.ticket)):
                self._requeue(pending, "Redis lost it in a restart")

    async def _watch_executors(self) -> None:
        """Requests whose executing instance's heartbeat is gone: queue again or fail."""
        remote = {p.executor for p in self._pending.values() if p.executor not in (None, self.store.name)}
        alive = await self.store.alive(sorted(x for x in remote if x is not None))
        for pending in list(self._pending.values()):
            if pending.executor is not None and alive.get(pending.executor, True) is False:
                self._retry_or_fail(pending, f"instance {pending.executor} running it stopped (no heartbeat "
                                             f"for {self.config.expire_period_ms} ms)")

    async def _executor_loop(self) -> None:
        await self._registered.wait()
        await self.executor.run()
