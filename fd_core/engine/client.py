"""The async engine client the API server talks to.

``EngineClient`` is the interface: submit a tokenized or text prompt and
iterate its ``RequestOutput``s (each carries the deltas since the last one),
abort, check health, read stats. ``MPEngineClient`` (engine core in its own
process, ZeroMQ between) is what the server uses; ``InprocEngineClient``
runs ``LLMEngine`` on a thread in this process, for tests and tools.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Container, Iterator
from dataclasses import dataclass
from typing import Any

from fd_core.config import EngineArgs
from fd_core.engine.outputs import RequestOutput
from fd_core.sampling.params import SamplingParams

__all__ = [
    "EngineClient", "EngineDeadError", "EngineInfo", "EngineStats", "InprocEngineClient", "RequestError",
    "admit", "engine_info_of",
]


class EngineDeadError(RuntimeError):
    """The engine core died or failed to start; the message carries its error."""


class RequestError(ValueError):
    """The engine refused a request (bad prompt, parameters that cannot fit)."""


@dataclass
class EngineInfo:
    """Facts the API layer needs about the running engine (``engine_info_of``)."""

    model_dir: str
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int  # block 0, the null block, included
    block_size: int
    backend: str
    max_num_seqs: int = 0  # 0: unknown
    num_host_blocks: int = 0  # the --swap-space tier
    enable_prefix_caching: bool = True


@dataclass
class EngineStats:
    """A snapshot of the engine for /metrics (``_stats_of``: every step, after
    aborts and while idle). ``time == 0`` means never taken: the engine has
    published nothing yet, so readers fall back to ``EngineInfo``."""

    num_running: int = 0
    num_waiting: int = 0  # queued in the scheduler, preempted ones included
    kv_cache_usage: float = 0.0  # fraction of usable KV blocks in use
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache, total since start
    prefix_cache_hits: int = 0  # of which found (device or host)
    num_preemptions: int = 0  # total since start
    num_free_blocks: int = 0  # blocks a request can get now, cached free ones included
    prefix_cache_host_hits: int = 0  # of the hits, tokens found only in the host tier
    num_preempted: int = 0  # waiting requests preempted now, to be recomputed
    num_enqueued: int = 0  # received by the engine, not yet handed to its scheduler
    num_free_uncached_blocks: int = 0  # free blocks holding no cached prefix
    num_cached_blocks: int = 0  # blocks holding a cached prefix, in use or free
    # speculative decoding, totals since start (0 when off): drafts scored, accepted,
    # tokens emitted by the steps that verified drafts, and those request-steps
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_emitted_tokens: int = 0
    spec_num_verify_steps: int = 0
    time: float = 0.0  # time.time() when taken; 0: never


class EngineClient(abc.ABC):
    """What the API server needs from an engine."""

    tokenizer: Any
    info: EngineInfo

    @abc.abstractmethod
    def generate(
        self,
        request_id: str,
        prompt: str | list[int] | dict[str, Any],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request and yield its outputs until one is ``finished``.

        Raises RequestError (before the first output) for a request the
        engine refuses, EngineDeadError if the engine dies meanwhile.
        Cancelling the iteration (client disconnect) aborts the request.
        """

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Abort a request; its KV blocks are freed at the engine's next step."""

    @abc.abstractmethod
    async def check_health(self) -> None:
        """Raise EngineDeadError if the engine is not serving."""

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """The latest engine stats (cheap: no round trip)."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop the engine."""

    def start(self) -> None:
        """Start the client's background tasks in the running loop (``admit`` calls it on
        every request; it must be cheap once started). Default: nothing to start."""
        return None


async def admit(client: EngineClient, request_id: str, in_flight: Container[str],
                closing: BaseException | None) -> None:
    """The checks at the top of a ``generate`` (``MPEngineClient``, ``DataParallelClient``,
    ``GlobalSchedulerClient``): the engine serves, the client is not shutting down
    (``closing``: the error ``abort_all`` set), its tasks run, ``request_id`` is new."""
    await client.check_health()
    if closing is not None:
        raise closing
    client.start()
    if request_id in in_flight:
        raise RequestError(f"request id {request_id!r} is already in flight")


class InprocEngineClient(EngineClient):
    """``LLMEngine`` stepping on a background thread of this process."""

    def __init__(self, args: EngineArgs) -> None:
        from fd_core.engine.llm_engine import LLMEngine

        self.engine = LLMEngine(args)
        self.tokenizer = self.engine.tokenizer
        self.info = engine_info_of(self.engine.core)
        self._lock = threading.Lock()
        # A CPython lock is not fair: the loop, releasing and retaking it step after
        # step, could keep an add or an abort waiting for many steps. Callers count
        # themselves in ``_callers`` and the loop lets them in before its next step.
        self._turn = threading.Condition()
        self._callers = 0
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stats = _stats_of(self.engine.core)
        self._error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="fd-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop:
                with self._turn:
                    self._turn.wait_for(lambda: not self._callers, timeout=0.5)
                with self._lock:
                    busy = self.engine.has_unfinished_requests()
                    outputs = self.engine.step() if busy else []
                    self._stats = _stats_of(self.engine.core)
                for out in outputs:
                    target = self._queues.get(out.request_id)
                    if target is not None:
                        loop, queue = target
                        loop.call_soon_threadsafe(queue.put_nowait, out)
                if not busy:
                    self._wake.wait(0.05)
                    self._wake.clear()
        except BaseException as exc:  # the engine is dead: fail every waiter
            self._error = exc
            for loop, queue in list(self._queues.values()):
                loop.call_soon_threadsafe(queue.put_nowait, exc)

    async def generate(
        self, request_id: str, prompt: str | list[int] | dict[str, Any], params: SamplingParams,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        await self.check_health()
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue)
        try:
            with self._engine_turn():
                try:
                    self.engine.add_request(request_id, prompt, params, arrival_time)
                except (ValueError, TypeError) as exc:
                    raise RequestError(str(exc)) from None
            self._wake.set()
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"engine failed: {type(item).__name__}: {item}")
                yield item
                if item.finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            await self.abort(request_id)

    @contextlib.contextmanager
    def _engine_turn(self) -> Iterator[None]:
        """The engine, between two steps of the loop (which waits for every caller)."""
        with self._turn:
            self._callers += 1
        try:
            with self._lock:
                yield
        finally:
            with self._turn:
                self._callers -= 1
                self._turn.notify_all()

    async def abort(self, request_id: str) -> None:
        with self._engine_turn():
            self.engine.abort_request(request_id)
            self._stats = _stats_of(self.engine.core)  # the freed blocks show at once

    async def check_health(self) -> None:
        if self._error is not None or not self._thread.is_alive():
            raise EngineDeadError(f"engine is not running: {self._error!r}")

    def stats(self) -> EngineStats:
        return self._stats

    async def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)


def engine_info_of(core: Any) -> EngineInfo:
    """EngineInfo of an EngineCore (in the engine's process; sent to the API once)."""
    cache, sched = core.cache_config, core.scheduler_config
    return EngineInfo(
        model_dir=str(core.model_dir), max_model_len=sched.max_model_len,
        vocab_size=core.model_config.vocab_size, num_kv_blocks=cache.num_blocks,
        block_size=cache.block_size, backend=core.backend.name, max_num_seqs=sched.max_num_seqs,
        num_host_blocks=cache.num_host_blocks, enable_prefix_caching=cache.enable_prefix_caching,
    )


def _stats_of(core: Any) -> EngineStats:
    """EngineStats from an EngineCore (called in the engine's own thread/process)."""
    st = core.scheduler.make_stats()
    spec = getattr(core, "spec", None)
    sp = spec.stats if spec is not None else None
    return EngineStats(
        num_running=st.num_running,
        num_waiting=st.num_waiting,
        kv_cache_usage=st.kv_cache_usage,
        prefix_cache_queries=st.prefix_cache_queries,
        prefix_cache_hits=st.prefix_cache_hits,
        num_preemptions=st.num_preemptions,
        num_free_blocks=st.num_free_blocks,
        prefix_cache_host_hits=st.prefix_cache_host_hits,
        num_preempted=st.num_preempted,
        num_free_uncached_blocks=st.num_free_uncached_blocks,
        num_cached_blocks=st.num_cached_blocks,
        spec_num_draft_tokens=sp.num_draft_tokens if sp else 0,
        spec_num_accepted_tokens=sp.num_accepted_tokens if sp else 0,
        spec_num_emitted_tokens=sp.num_emitted_tokens if sp else 0,
        spec_num_verify_steps=sp.num_verify_steps if sp else 0,
        time=time.time(),
    )
