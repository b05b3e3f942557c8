"""Moving task and reply messages (lists of byte frames) between instances.

``transport_for(protocols, pm)`` picks the first protocol that something
answers: a backend's ``fd_kv_transport(protocol=...)`` hook (RDMA, IPC,
NVLink: the backend's business), else the built-in ``tcp``: ZeroMQ over TCP,
a ROUTER socket on the prefill side and one DEALER per transfer on the decode
side. A name nobody answers (FastDeploy's ``ipc``, ``rdma`` without such a
backend) is refused, naming it.

A transport has ``listen(address, on_task)`` (prefill side: ``on_task(frames,
reply)`` is called on the transport's thread; ``reply(frames)`` may be called
later from any thread) and ``request(address, frames, timeout_s)`` (decode
side: blocks for the reply; TransferError on timeout, naming the peer).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import zmq

from fd_core.disagg.config import BUILTIN_PROTOCOL
from fd_core.disagg.wire import TransferError
from fd_core.plugins.types import KVTransport

__all__ = ["KVTransport", "TcpTransport", "transport_for", "release"]

logger = logging.getLogger(__name__)
Reply = Callable[[list[bytes]], None]


class TcpTransport:
    """The built-in transport: ZeroMQ multipart messages over TCP."""

    name = BUILTIN_PROTOCOL

    def __init__(self) -> None:
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._replies: queue.SimpleQueue[tuple[bytes, list[bytes]]] = queue.SimpleQueue()
        self._wake_addr = f"inproc://fd-disagg-wake-{id(self)}"
        self._wake_local = threading.local()

    # ---------------------------------------------------------- prefill side

    def listen(self, address: str, on_task: Callable[[list[bytes], Reply], None]) -> None:
        """Serve tasks on ``tcp://address`` in a daemon thread; OSError-like
        zmq.ZMQError at once when the port is taken."""
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        try:
            sock.bind(f"tcp://{address}")
        except zmq.ZMQError as exc:
            sock.close()
            raise OSError(f"cannot listen for KV-transfer tasks on {address}: {exc}") from None
        wake = self._ctx.socket(zmq.PULL)
        wake.bind(f"{self._wake_addr}-{len(self._threads)}")
        index = len(self._threads)
        thread = threading.Thread(target=self._serve, args=(sock, wake, on_task, index),
                                  name=f"fd-disagg-listen-{address}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _serve(self, sock: Any, wake: Any, on_task: Callable[[list[bytes], Reply], None], index: int) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        pending: dict[bytes, list[bytes]] = {}
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(200))
                if wake in events:
                    while True:
                        try:
                            ident, frames = wake.recv_pyobj(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        pending[ident] = frames
                for ident, frames in pending.items():
                    sock.send_multipart([ident, *frames], copy=False)
                pending.clear()
                if sock in events:
                    while True:
                        try:
                            ident, *frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        on_task(frames, self._replier(ident, index))
        finally:
            sock.close(0)
            wake.close(0)

    def _replier(self, ident: bytes, index: int) -> Reply:
        def reply(frames: list[bytes]) -> None:
            push = getattr(self._wake_local, f"push{index}", None)
            if push is None:
                push = self._ctx.socket(zmq.PUSH)
                push.setsockopt(zmq.LINGER, 1000)
                push.connect(f"{self._wake_addr}-{index}")
                setattr(self._wake_local, f"push{index}", push)
            push.send_pyobj((ident, frames))

        return reply

    # ----------------------------------------------------------- decode side

    def request(self, address: str, frames: list[bytes], timeout_s: float) -> list[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(f"tcp://{address}")
            sock.send_multipart(frames, copy=False)
            if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
                raise TransferError(f"prefill instance {address} did not answer within {round(timeout_s, 1):g} s "
                                    "(down, or overloaded); check that it runs with --splitwise-role prefill "
                                    "and that --innode-prefill-ports names its --engine-worker-queue-port")
            return list(sock.recv_multipart())
        finally:
            sock.close(0)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)


def transport_for(protocols: tuple[str, ...], pm: Any = None) -> KVTransport:
    """The first of ``protocols`` something answers (a backend hook, else the built-in tcp)."""
    for name in protocols:
        if pm is not None:
            found = pm.hook.fd_kv_transport(protocol=name)
            if found is not None:
                return found  # type: ignore[no-any-return]
        if name == BUILTIN_PROTOCOL:
            return TcpTransport()
    raise ValueError(f"--cache-transfer-protocol {','.join(protocols)}: no installed backend brings "
                     f"{' or '.join(protocols)}; fd-core's built-in transport is {BUILTIN_PROTOCOL!r} "
                     f"(--cache-transfer-protocol {BUILTIN_PROTOCOL})")


def release(pool: Any, transport: Any, fds: tuple[int, ...]) -> None:
    """Free a prefill or decode engine's resources: its transfer threads (``pool``, or None),
    its transport and its wake pipe. Called once, by ``close()`` or when the engine is dropped."""
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    transport.close()
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
