"""The async client of an engine core running in its own process.

The API process keeps the tokenizer and the output processor; the engine
process (``fd_core.engine.engine_process``) owns paddle, the model and the
KV cache. ``MPEngineClient(args)`` starts the engine and owns it (``fd-serve``
with one API process); ``MPEngineClient(args, endpoint=..., process=...)``
attaches to an engine another process owns (each of ``--workers N``). If the
engine dies, every waiting request fails with EngineDeadError and
``check_health`` raises, so the server can exit instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from fd_core.config import EngineArgs
from fd_core.engine.client import (
    EngineClient,
    EngineDeadError,
    EngineStats,
    RequestError,
    admit,
)
from fd_core.engine.engine_process import EngineEndpoint, run_engine_process, start_engine_process
from fd_core.engine.frontend import Frontend, eos_token_ids_of
from fd_core.engine.outputs import RequestOutput
from fd_core.sampling.params import SamplingParams

__all__ = ["MPEngineClient", "run_engine_process"]

logger = logging.getLogger(__name__)


class MPEngineClient(EngineClient):
    """Talks to the engine process and streams its outputs to asyncio waiters."""

    def __init__(self, args: EngineArgs, startup_timeout: float = 900.0,
                 endpoint: EngineEndpoint | None = None, process: Any = None) -> None:
        """Start an engine process and own it; or, given ``endpoint`` and ``process``
        (anything with ``is_alive()``, ``exitcode`` and ``pid``), attach to a running one."""
        from fd_core.model_loader import resolve_model_path
        from fd_core.models.config import load_config
        from fd_core.tokenizer import Tokenizer

        self.args = args
        model_dir = resolve_model_path(args.model, revision=args.revision)
        self.tokenizer = Tokenizer.from_pretrained(args.tokenizer or model_dir, chat_template=args.chat_template)
        model_config = load_config(model_dir)
        eos = eos_token_ids_of(self.tokenizer, model_config.eos_token_ids)
        self.frontend = Frontend(self.tokenizer, eos, model_config.vocab_size, args.max_model_len)
        self.owner = endpoint is None
        self._socket_dir: str | None = None
        if endpoint is None:
            process, endpoint, self._socket_dir = start_engine_process(args, startup_timeout)
        elif process is None:
            raise ValueError("attaching to an engine needs its process (or a view of it) too")
        self.process = process
        self.endpoint = endpoint
        self.info = endpoint.info
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.ROUTING_ID, f"api-{os.getpid()}-{uuid.uuid4().hex[:8]}".encode())
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint.address)
        self._queues: dict[str, asyncio.Queue] = {}
        self._stats = EngineStats()
        self._error: str | None = None
        self._closing: BaseException | None = None  # set by abort_all: new requests fail with it
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------ running

    def start(self) -> None:
        """Start receiving (in the running event loop): stats are fresh from here on,
        before the first request. ``generate`` calls it too."""
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._output_loop()), loop.create_task(self._watch_process())]

    async def _send(self, *msg: Any) -> None:
        await self._sock.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    async def _output_loop(self) -> None:
        try:
            await self._receive()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug here must not leave every request waiting forever
            self._error = f"the API process stopped receiving engine outputs: {type(exc).__name__}: {exc}"
            logger.exception("%s", self._error)
            for queue in self._queues.values():
                queue.put_nowait(EngineDeadError(self._error))

    async def _receive(self) -> None:
        await self._send("hello")
        while True:
            msg = pickle.loads(await self._sock.recv())
            if msg[0] == "refused":
                self._fail(msg[1], RequestError(msg[2]))
                continue
            _, outputs, self._stats = msg
            if not outputs:
                continue
            results, stopped = self.frontend.processor.process(outputs)
            if stopped:
                await self._send("abort", stopped, True)
            for out in results:
                queue = self._queues.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)

    def _fail(self, core_request_id: str, error: Exception) -> None:
        parent_id = self.frontend.processor.parent_of(core_request_id)
        queue = self._queues.get(parent_id) if parent_id is not None else None
        if queue is not None:
            queue.put_nowait(error)

    async def _watch_process(self) -> None:
        while self.process.is_alive():
            await asyncio.sleep(0.5)
        self._error = f"the engine process died (exit code {self.process.exitcode}); see its log above"
        logger.error("%s", self._error)
        for queue in self._queues.values():
            queue.put_nowait(EngineDeadError(self._error))

    async def generate(
        self, request_id: str, prompt: str | list[int] | dict[str, Any], params: SamplingParams,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        await admit(self, request_id, self._queues, self._closing)
        try:
            requests = self.frontend.prepare(request_id, prompt, params, arrival_time or time.time())
        except (ValueError, TypeError) as exc:
            raise RequestError(str(exc)) from None
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        finished = False
        try:
            await self._send("add", requests)
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item  # RequestError, EngineDeadError, or abort_all's error
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:  # refused, cancelled or client gone: free it in the engine
                ids = self.frontend.processor.abort(request_id)
                if ids and self._error is None:
                    await self._send("abort", ids, False)

    async def abort(self, request_id: str) -> None:
        ids = self.frontend.processor.abort(request_id)
        if ids and self._error is None:
            await self._send("abort", ids, False)

    async def abort_all(self, error: BaseException) -> int:
        """Abort every request in flight: each waiter raises ``error`` (the API layer
        answers it as its error response or SSE error event), and so does every later
        ``generate``. Returns how many requests were aborted."""
        self._closing = error
        ids: list[str] = []
        for request_id, queue in list(self._queues.items()):
            ids.extend(self.frontend.processor.abort(request_id))
            queue.put_nowait(error)
        if ids and self._error is None:
            await self._send("abort", ids, False)
        return len(self._queues)

    @property
    def num_in_flight(self) -> int:
        return len(self._queues)

    async def check_health(self) -> None:
        if self._error is not None or not self.process.is_alive():
            raise EngineDeadError(self._error or f"the engine process exited with code {self.process.exitcode}")

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def dead(self) -> bool:
        return self._error is not None or not self.process.is_alive()

    async def shutdown(self) -> None:
        """Stop receiving; the owner also stops the engine process (an attached
        client leaves it to its owner)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.owner and self.process.is_alive():
            try:
                await self._send("shutdown")
            except zmq.ZMQError:
                pass
            await asyncio.to_thread(self.process.join, 10)
        self.close()

    def close(self) -> None:
        """Release this client without waiting (the owner kills its engine if still alive)."""
        if self.owner:
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout=10)
            if self._socket_dir is not None:
                shutil.rmtree(self._socket_dir, ignore_errors=True)
                self._socket_dir = None
        if not self._ctx.closed:
            self._ctx.destroy(linger=0)

    @staticmethod
    def new_request_id(prefix: str = "req") -> str:
        return f"{prefix}-{uuid.uuid4().hex}"
