"""The engine core in its own process, and the async client that drives it.

The API process keeps the tokenizer and the output processor; the engine
process owns paddle, the model and the KV cache. They talk over two ZeroMQ
IPC sockets (requests in, outputs out) with pickled plain dataclasses.
The engine process reports ``ready`` (or its start-up traceback) on a pipe;
if it dies later, every waiting request fails with EngineDeadError and
``check_health`` raises, so the server can exit instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from fd_core.config import EngineArgs
from fd_core.engine.client import (
    EngineClient,
    EngineDeadError,
    EngineInfo,
    EngineStats,
    RequestError,
)
from fd_core.engine.frontend import Frontend, eos_token_ids_of
from fd_core.engine.outputs import RequestOutput
from fd_core.sampling.params import SamplingParams

__all__ = ["MPEngineClient", "run_engine_process"]

logger = logging.getLogger(__name__)

# messages, API -> engine: ("add", [EngineCoreRequest]), ("abort", ids, stopped: bool), ("shutdown",)
# engine -> API: ("outputs", [EngineCoreOutput], EngineStats), ("refused", request_id, message)


def run_engine_process(args: EngineArgs, input_addr: str, output_addr: str, ready: Any) -> None:
    """Main of the engine process: build the core, then step while there is work."""
    from fd_core.engine.client import _stats_of
    from fd_core.engine.core import EngineCore
    from fd_core.engine.request import RequestStatus

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [engine] %(name)s: %(message)s")
    parent = os.getppid()
    try:
        core = EngineCore(args)
        info = EngineInfo(str(core.model_dir), args.max_model_len, core.model_config.vocab_size,
                          core.cache_config.num_blocks, core.cache_config.block_size, core.backend.name)
    except BaseException:
        ready.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(input_addr)
    outbox = ctx.socket(zmq.PUSH)
    outbox.bind(output_addr)
    ready.send(("ready", info))
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    while True:
        busy = core.has_unfinished_requests()
        events = dict(poller.poll(0 if busy else 100))
        while inbox in events:
            msg = pickle.loads(inbox.recv())
            if msg[0] == "shutdown":
                return
            if msg[0] == "add":
                for req in msg[1]:
                    try:
                        core.add_request(req)
                    except (ValueError, TypeError) as exc:
                        outbox.send(pickle.dumps(("refused", req.request_id, str(exc))))
            elif msg[0] == "abort":
                status = RequestStatus.FINISHED_STOPPED if msg[2] else RequestStatus.FINISHED_ABORTED
                core.abort(msg[1], status)
            events = dict(poller.poll(0))
        if core.has_unfinished_requests():
            outputs = core.step()
            outbox.send(pickle.dumps(("outputs", outputs, _stats_of(core)), protocol=pickle.HIGHEST_PROTOCOL))
        elif os.getppid() != parent:
            return  # the API process is gone


class MPEngineClient(EngineClient):
    """Starts the engine process and streams its outputs to asyncio waiters."""

    def __init__(self, args: EngineArgs, startup_timeout: float = 900.0) -> None:
        from fd_core.model_loader import resolve_model_path
        from fd_core.models.config import load_config
        from fd_core.tokenizer import Tokenizer

        self.args = args
        model_dir = resolve_model_path(args.model)
        self.tokenizer = Tokenizer.from_pretrained(args.tokenizer or model_dir, chat_template=args.chat_template)
        model_config = load_config(model_dir)
        eos = eos_token_ids_of(self.tokenizer, model_config.eos_token_ids)
        self.frontend = Frontend(self.tokenizer, eos, model_config.vocab_size, args.max_model_len)
        self._dir = tempfile.mkdtemp(prefix="fd-engine-")
        self._input_addr = f"ipc://{self._dir}/input"
        self._output_addr = f"ipc://{self._dir}/output"
        mp = multiprocessing.get_context("spawn")
        parent_end, child_end = mp.Pipe(duplex=False)
        self.process = mp.Process(
            target=run_engine_process, args=(args, self._input_addr, self._output_addr, child_end),
            name="fd-engine-core", daemon=True,
        )
        self.process.start()
        child_end.close()
        self.info = self._wait_ready(parent_end, startup_timeout)
        self._ctx = zmq.asyncio.Context()
        self._send_sock = self._ctx.socket(zmq.PUSH)
        self._send_sock.connect(self._input_addr)
        self._recv_sock = self._ctx.socket(zmq.PULL)
        self._recv_sock.connect(self._output_addr)
        self._queues: dict[str, asyncio.Queue] = {}
        self._stats = EngineStats()
        self._error: str | None = None
        self._tasks: list[asyncio.Task] = []

    def _wait_ready(self, pipe: Any, timeout: float) -> EngineInfo:
        deadline = time.monotonic() + timeout
        while not pipe.poll(0.2):
            if not self.process.is_alive():
                raise EngineDeadError(f"the engine process exited with code {self.process.exitcode} while starting")
            if time.monotonic() > deadline:
                self.process.kill()
                raise EngineDeadError(f"the engine did not start within {timeout:.0f} s")
        try:
            kind, payload = pipe.recv()
        except EOFError:
            raise EngineDeadError(f"the engine process exited (code {self.process.exitcode}) while starting") from None
        if kind != "ready":
            self.process.join(timeout=10)
            raise EngineDeadError(f"the engine failed to start:\n{payload}")
        return payload  # type: ignore[no-any-return]

    # ------------------------------------------------------------ running

    def _ensure_tasks(self) -> None:
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._output_loop()), loop.create_task(self._watch_process())]

    async def _send(self, *msg: Any) -> None:
        await self._send_sock.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    async def _output_loop(self) -> None:
        while True:
            msg = pickle.loads(await self._recv_sock.recv())
            if msg[0] == "refused":
                self._fail(msg[1], RequestError(msg[2]))
                continue
            _, outputs, self._stats = msg
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
        await self.check_health()
        self._ensure_tasks()
        if request_id in self._queues:
            raise RequestError(f"request id {request_id!r} is already in flight")
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
                if isinstance(item, RequestError):
                    raise item
                if isinstance(item, Exception):
                    raise EngineDeadError(str(item))
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

    async def check_health(self) -> None:
        if self._error is not None or not self.process.is_alive():
            raise EngineDeadError(self._error or f"the engine process exited with code {self.process.exitcode}")

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def dead(self) -> bool:
        return self._error is not None or not self.process.is_alive()

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.process.is_alive():
            try:
                await self._send("shutdown")
            except zmq.ZMQError:
                pass
            self.process.join(timeout=10)
            if self.process.is_alive():
                self.process.kill()
        self._ctx.destroy(linger=0)

    @staticmethod
    def new_request_id(prefix: str = "req") -> str:
        return f"{prefix}-{uuid.uuid4().hex}"
