"""Rank 0 -> workers: each runner call written once into shared memory, read by all.

Rank 0 pickles a message once into a shared-memory buffer and wakes each
worker with its length (8 bytes down the worker's wake pipe); every worker
reads the same bytes. A worker answers on its own pipe: ``M`` when it reaches
the rendezvous (so a rank that never does is named), ``R`` once loaded,
``A`` when it has copied a message out (rank 0 waits for every ``A`` only
before it overwrites the buffer with the next message, so a step costs no round
trip), ``E`` + length + text with its traceback before it exits on an error.
A closed pipe is a dead process: a worker whose wake pipe closes exits (rank 0
is gone), rank 0 reports a worker whose answer pipe closes. The buffer is a
file under /dev/shm that rank 0 unlinks as soon as every worker has mapped it,
so nothing outlives the processes, however they end.

A rank on another host (``--ips``, ``fd_core.parallel.multinode``) has one TCP
socket instead of the two pipes and no buffer: the message follows its length
on the socket (the same pickled bytes every rank gets), and its answers come
back on the same socket.
"""

from __future__ import annotations

import mmap
import os
import pickle
import secrets
import select
import socket
import struct
from typing import Any

__all__ = ["CAPACITY", "ChannelClosed", "DriverChannel", "WorkerChannel"]

CAPACITY = 64 << 20  # bytes of the message buffer (pages are touched only as used)
_LEN = struct.Struct("<Q")


class ChannelClosed(EOFError):
    """The other end's pipe closed: its process is gone."""


def _read_exact(fd: int, n: int) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < n:
        try:
            chunk = os.read(fd, min(n - got, 1 << 22))
        except ConnectionResetError:  # a socket whose other end closed with our answers unread
            chunk = b""
        if not chunk:
            raise ChannelClosed(f"pipe {fd} closed")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _map(path: str, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, CAPACITY)
        return mmap.mmap(fd, CAPACITY)
    finally:
        os.close(fd)


class DriverChannel:
    """Rank 0's end: the buffer, a wake pipe to each worker and an answer pipe from each."""

    def __init__(self, num_workers: int) -> None:
        self.path = f"/dev/shm/fd_tp_{os.getpid()}_{secrets.token_hex(6)}"
        self.buf = _map(self.path, create=True)
        self.wake = [os.pipe() for _ in range(num_workers)]  # (worker reads, rank 0 writes)
        self.answer = [os.pipe() for _ in range(num_workers)]  # (rank 0 reads, worker writes)
        self._unacked = False
        self.arrived: set[int] = set()  # workers that said ``M`` (reached the rendezvous)
        self._ready: set[int] = set()
        self.remote: dict[int, socket.socket] = {}  # worker index -> its socket (another host)

    def add_remote(self, sock: socket.socket) -> int:
        """A worker on another host, reached through ``sock``; its index."""
        i = len(self.wake)
        self.wake.append((-1, sock.fileno()))
        self.answer.append((sock.fileno(), -1))
        self.remote[i] = sock
        return i

    def worker_fds(self, i: int) -> tuple[int, int]:
        """(wake read end, answer write end) that worker ``i`` inherits."""
        return self.wake[i][0], self.answer[i][1]

    def close_worker_ends(self) -> None:
        """After the workers started: rank 0 keeps only its own ends (so EOF means death)."""
        for r, _ in self.wake:
            if r >= 0:
                os.close(r)
        for _, w in self.answer:
            if w >= 0:
                os.close(w)
        self.wake = [(-1, w) for _, w in self.wake]
        self.answer = [(r, -1) for r, _ in self.answer]

    def wait_ready(self, i: int, timeout_s: float) -> None:
        """Worker ``i``'s ``R``; raises ChannelClosed (died), RuntimeError (its error), TimeoutError."""
        if i in self._ready:
            return
        kind = self._answer(i, timeout_s)
        while kind == b"M":
            kind = self._answer(i, timeout_s)
        if kind != b"R":
            raise RuntimeError(f"unexpected answer {kind!r} from worker {i}")
        self._ready.add(i)

    def poll(self, i: int) -> None:
        """Read what worker ``i`` said so far without blocking (``M``, ``R``; an ``E`` raises RuntimeError)."""
        fd = self.answer[i][0]
        while select.select([fd], [], [], 0)[0]:
            if self._answer(i, 0) == b"R":
                self._ready.add(i)

    def _answer(self, i: int, timeout_s: float | None) -> bytes:
        fd = self.answer[i][0]
        if timeout_s is not None:
            ready, _, _ = select.select([fd], [], [], timeout_s)
            if not ready:
                raise TimeoutError(f"no answer from worker {i} within {timeout_s:.0f} s")
        kind = _read_exact(fd, 1)
        if kind == b"E":
            n = _LEN.unpack(_read_exact(fd, _LEN.size))[0]
            raise RuntimeError(_read_exact(fd, n).decode(errors="replace"))
        if kind == b"M":
            self.arrived.add(i)
        return kind

    def error_text(self, i: int) -> str | None:
        """What a dead worker said before it died, if anything (non-blocking)."""
        fd = self.answer[i][0]
        try:
            while select.select([fd], [], [], 0)[0]:
                self._answer(i, 0)
        except RuntimeError as exc:
            return str(exc)
        except (ChannelClosed, OSError, TimeoutError):
            return None
        return None

    def gone(self, i: int) -> bool:
        """Whether worker ``i``'s end closed (nothing left to read from it)."""
        fd = self.answer[i][0]
        try:
            if not select.select([fd], [], [], 0)[0]:
                return False
            if i in self.remote:
                return self.remote[i].recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
        return False

    def send(self, message: Any) -> None:
        """Write ``message`` once for every worker (after they all copied the last one)."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > CAPACITY:
            raise ValueError(f"a step message of {len(data)} bytes exceeds the channel's {CAPACITY} bytes")
        if self._unacked:
            for i in range(len(self.answer)):
                if self._answer(i, None) != b"A":
                    raise RuntimeError(f"unexpected answer from worker {i}")
        self.buf[: len(data)] = data
        header = _LEN.pack(len(data))
        for i, (_, w) in enumerate(self.wake):
            if i in self.remote:
                self.remote[i].sendall(header + data)
            else:
                os.write(w, header)
        self._unacked = True

    def close(self) -> None:
        if self.buf.closed:
            return
        for sock in self.remote.values():
            sock.close()
        remote = {sock for i in self.remote for sock in self.wake[i] + self.answer[i]}
        for fd in (fd for fds in (*self.wake, *self.answer) for fd in fds if fd >= 0 and fd not in remote):
            try:
                os.close(fd)
            except OSError:
                pass
        self.wake = self.answer = []
        self.remote = {}
        self.unlink()
        self.buf.close()

    def unlink(self) -> None:
        """Remove the buffer's name (every worker has mapped it by then)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class WorkerChannel:
    """A worker's end: the buffer by name, its wake pipe and its answer pipe."""

    def __init__(self, path: str | None, wake_fd: int, answer_fd: int) -> None:
        """``path`` None: a rank on another host, whose messages follow their length on ``wake_fd``."""
        self.buf = _map(path, create=False) if path is not None else None
        self.wake_fd = wake_fd
        self.answer_fd = answer_fd

    def reached_rendezvous(self) -> None:
        os.write(self.answer_fd, b"M")

    def ready(self) -> None:
        os.write(self.answer_fd, b"R")

    def receive(self) -> Any:
        """The next message (blocks); raises ChannelClosed when rank 0 is gone."""
        n = _LEN.unpack(_read_exact(self.wake_fd, _LEN.size))[0]
        message = pickle.loads(self.buf[:n] if self.buf is not None else _read_exact(self.wake_fd, n))
        os.write(self.answer_fd, b"A")
        return message

    def error(self, text: str) -> None:
        data = text.encode()[-16000:]
        try:
            os.write(self.answer_fd, b"E" + _LEN.pack(len(data)) + data)
        except OSError:
            pass
