"""The engine core in its own process, serving one or more API processes.

One ZeroMQ ROUTER socket (IPC) carries pickled plain tuples both ways; each
API process is a DEALER with its own routing id (``fd-serve --workers N``
runs N of them against one engine):

  API -> engine: ("hello",)                    register; the engine answers with its stats
                 ("add", [EngineCoreRequest])  outputs of these go back to the sender only
                 ("abort", ids, stopped: bool)
                 ("shutdown",)                 only the owner (the process that started it) sends it
  engine -> API: ("outputs", [EngineCoreOutput], EngineStats)  the sender's outputs of one step
                 ("refused", request_id, message)

Stats go to every registered API process after each step and after any
message that changed the engine's state without a step (an abort while idle,
a refusal), so /metrics is right at every moment, not at the next request.

The engine ignores SIGINT and SIGTERM: a Ctrl+C or a process-group SIGTERM
(systemd, container runtimes) reaches it together with its server, which
drains its requests first and then tells it to stop. It exits on
("shutdown",) or as soon as its parent process is gone (even SIGKILLed).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

import zmq

from fd_core.config import EngineArgs
from fd_core.engine.client import EngineDeadError, EngineInfo, engine_info_of

__all__ = ["EngineEndpoint", "EngineProcessView", "run_engine_process", "start_engine_process",
           "stop_engine_process"]

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 100  # how long the idle engine waits for a message (and how often it checks its parent)


@dataclass(frozen=True)
class EngineEndpoint:
    """What an API process needs to attach to a running engine (picklable)."""

    address: str  # ipc:// address of the engine's ROUTER socket
    info: EngineInfo
    pid: int


def run_engine_process(args: EngineArgs, address: str, ready: Any) -> None:
    """Main of the engine process: build the core, then step while there is work."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    from fd_core.engine.core import EngineCore

    parent = os.getppid()
    try:
        _setup_logging()
        core = EngineCore(args)
        if args.core_wrapper is not None:  # --splitwise-role prefill/decode: fd_core.disagg
            core = args.core_wrapper(core, args)
        info = engine_info_of(core)
    except BaseException:
        ready.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    # a ROUTER drops what it cannot queue: never lose an output to a busy API process
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    ready.send(("ready", info))
    try:
        _EngineLoop(core, sock).run(parent)
    finally:
        close = getattr(core, "close", None)  # a prefill/decode engine: its listening socket, threads, pipe
        if args.core_wrapper is not None and close is not None:
            close()
        sock.close()
        ctx.term()
        if os.getppid() != parent and address.startswith("ipc://"):
            # the server died without cleaning up (SIGKILL): remove the socket's directory ourselves
            shutil.rmtree(os.path.dirname(address[len("ipc://"):]), ignore_errors=True)


def _setup_logging() -> None:
    try:
        from fd_core.logging_setup import setup_logging
    except ImportError:  # pragma: no cover - a tree without log files
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [engine] %(name)s: %(message)s")
    else:
        setup_logging("engine")


class _EngineLoop:
    """Messages in, steps, outputs routed to the API process that owns each request."""

    def __init__(self, core: Any, sock: zmq.Socket) -> None:
        self.core = core
        self.sock = sock
        self.clients: list[bytes] = []  # routing ids that said hello
        self.owners: dict[str, bytes] = {}  # engine-core request id -> routing id

    def run(self, parent: int) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        wakeup = getattr(self.core, "wakeup_fd", None)  # fd_core.disagg: a KV-transfer task or reply landed
        if wakeup is not None:
            poller.register(wakeup, zmq.POLLIN)
        while os.getppid() == parent:  # the server is gone (even SIGKILLed): so is its engine
            busy = self.core.has_unfinished_requests()
            events = dict(poller.poll(0 if busy else IDLE_POLL_MS))
            changed = False
            while self.sock in events:
                ident, payload = self.sock.recv_multipart()
                msg = pickle.loads(payload)
                if msg[0] == "shutdown":
                    return
                self.handle(ident, msg)
                changed = True
                events = dict(poller.poll(0))
            if self.core.has_unfinished_requests():
                self.publish(self.core.step())
            elif changed:
                self.publish([])

    def handle(self, ident: bytes, msg: tuple) -> None:
        from fd_core.engine.request import RequestStatus

        kind = msg[0]
        if kind == "hello":
            if ident not in self.clients:
                self.clients.append(ident)
        elif kind == "add":
            for req in msg[1]:
                try:
                    self.core.add_request(req)
                except (ValueError, TypeError) as exc:
                    self.send(ident, ("refused", req.request_id, str(exc)))
                else:
                    self.owners[req.request_id] = ident
        elif kind == "abort":
            # only the API process that owns a request may end it: with --workers, a client's
            # request_id sent to two workers at once is refused by the engine in one of them,
            # whose clean-up abort must not end the other's request
            ids = [rid for rid in msg[1] if self.owners.get(rid) == ident]
            status = RequestStatus.FINISHED_STOPPED if msg[2] else RequestStatus.FINISHED_ABORTED
            self.core.abort(ids, status)
            for rid in ids:
                del self.owners[rid]
        else:
            logger.error("ignoring an unknown message %r from an API process", kind)

    def publish(self, outputs: list[Any]) -> None:
        from fd_core.engine.client import _stats_of

        routed: dict[bytes, list[Any]] = {ident: [] for ident in self.clients}
        for out in outputs:
            ident = self.owners.get(out.request_id)
            if ident is None:
                continue  # aborted meanwhile
            routed.setdefault(ident, []).append(out)
            if out.finished:
                del self.owners[out.request_id]
        stats = _stats_of(self.core)
        for ident, outs in routed.items():
            self.send(ident, ("outputs", outs, stats))

    def send(self, ident: bytes, msg: tuple) -> None:
        self.sock.send_multipart([ident, pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)])


def start_engine_process(args: EngineArgs, startup_timeout: float = 900.0) -> tuple[Any, EngineEndpoint, str]:
    """Start the engine process and wait until it serves.

    Returns (the multiprocessing.Process, its endpoint, the temporary directory
    holding its socket, to remove after it stops). Raises EngineDeadError with
    the engine's traceback if it fails to start.
    """
    socket_dir = tempfile.mkdtemp(prefix="fd-engine-")
    address = f"ipc://{socket_dir}/engine"
    mp = multiprocessing.get_context("spawn")
    parent_end, child_end = mp.Pipe(duplex=False)
    process = mp.Process(target=run_engine_process, args=(args, address, child_end),
                         name="fd-engine-core", daemon=True)
    process.start()
    child_end.close()
    # multiprocessing's own exit hook terminates (SIGTERM, which the engine ignores) and joins
    # daemonic children; this one runs first and kills it, so no exit path can hang on it
    atexit.register(_kill, process)
    try:
        info = _wait_ready(process, parent_end, startup_timeout)
    except BaseException:
        _kill(process)
        shutil.rmtree(socket_dir, ignore_errors=True)  # nobody else knows of it yet
        raise
    return process, EngineEndpoint(address, info, process.pid or 0), socket_dir


def _wait_ready(process: Any, pipe: Any, timeout: float) -> EngineInfo:
    deadline = time.monotonic() + timeout
    while not pipe.poll(0.2):
        if not process.is_alive():
            raise EngineDeadError(f"the engine process exited with code {process.exitcode} while starting")
        if time.monotonic() > deadline:
            _kill(process)
            raise EngineDeadError(f"the engine did not start within {timeout:.0f} s")
    try:
        kind, payload = pipe.recv()
    except EOFError:
        process.join(timeout=10)
        raise EngineDeadError(f"the engine process exited (code {process.exitcode}) while starting") from None
    if kind != "ready":
        process.join(timeout=10)
        raise EngineDeadError(f"the engine failed to start:\n{payload}")
    return payload  # type: ignore[no-any-return]


def _kill(process: Any) -> None:
    if process.is_alive():
        process.kill()
        process.join(timeout=10)


def stop_engine_process(process: Any, address: str, timeout: float = 10.0) -> None:
    """Ask the engine to stop (from a process without a client), kill it if it does not."""
    if process.is_alive():
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(address)
        sock.send(pickle.dumps(("shutdown",)))
        process.join(timeout)
        sock.close()
        ctx.term()
    _kill(process)


class EngineProcessView:
    """The engine process as an API worker sees it: the main process owns and reaps
    it and sets ``dead``/``exitcode`` when it dies; if the main process is gone,
    so is the engine (it watches the same parent)."""

    def __init__(self, pid: int, main_pid: int, dead: Any, exitcode: Any) -> None:
        self.pid = pid
        self.main_pid = main_pid
        self.dead = dead  # multiprocessing Event
        self._exitcode = exitcode  # multiprocessing Value("i"); -1 while unknown

    def is_alive(self) -> bool:
        return not self.dead.is_set() and os.getppid() == self.main_pid

    @property
    def exitcode(self) -> int | None:
        code = int(self._exitcode.value)
        return None if code == -1 else code

    def mark_dead(self, exitcode: int | None) -> None:
        self._exitcode.value = -1 if exitcode is None else exitcode
        self.dead.set()
