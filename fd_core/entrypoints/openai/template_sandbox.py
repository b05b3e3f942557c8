"""Rendering a request's own ``chat_template`` outside the API process's event loop.

A request template is untrusted code: jinja2's sandbox keeps it away from
Python internals, but not from spending CPU or memory. So it renders in one
dedicated subprocess (started on the first request template, replaced after
it is killed), awaited from asyncio through a one-thread executor, which also
serializes the renders (one subprocess, one render at a time, no deadlock).
The subprocess is a fresh interpreter running this module (``subprocess``,
not multiprocessing's spawn, which would re-run the server's main script) and
talks over a socketpair with multiprocessing's Connection framing.

- a wall-clock limit per render (``timeout_s``): past it the subprocess is
  killed and the request gets a 400 naming ``chat_template``;
- a memory cap on the subprocess (RLIMIT_AS, ``memory_bytes``), so a memory
  bomb fails there (a MemoryError, or the subprocess dies) and never here;
- inside it, ``ChatTemplate(restricted=True)``: ``*``/``**``/``range`` size
  checks and the rendered-text size limit.

The subprocess ends with the API process: ``close`` runs at exit (and at app
shutdown where the app calls it), and a thread in it exits when its parent is
gone (a SIGKILLed parent runs no exit hooks).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["RENDER_TIMEOUT_S", "RenderError", "RenderLimitError", "RequestTemplateRenderer",
           "shared_renderer"]

RENDER_TIMEOUT_S = 2.0  # wall clock per request-template render
MEMORY_LIMIT_BYTES = 1 << 30  # address space of the render subprocess (RLIMIT_AS)
START_TIMEOUT_S = 60.0  # spawning the subprocess: a fresh interpreter importing jinja2


class RenderError(Exception):
    """The template raised (a jinja error, ``raise_exception``, a sandbox refusal); ``str`` is
    ``"<ExceptionType>: <message>"``."""


class RenderLimitError(RenderError):
    """The render went past the time or memory limit and was stopped; ``str`` is for the client."""


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:  # re-parented: the API process is gone
            os._exit(0)


def _serve(conn: Connection, memory_bytes: int | None, parent_pid: int) -> None:
    """The subprocess: answer ``(source, special_tokens, messages, add_generation_prompt, tools,
    kwargs)`` jobs with ``("ok", text)``, ``("error", "Type: message")`` or ``("memory", "")``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the API process, which ends us
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    from fd_core.tokenizer.chat_template import ChatTemplate

    if memory_bytes:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        except (ImportError, ValueError, OSError):
            pass  # no cap on this platform; the time limit still holds
    conn.send(("ready", ""))
    while True:
        try:
            source, special_tokens, messages, add_generation_prompt, tools, kwargs = conn.recv()
        except EOFError:
            return
        try:
            template = ChatTemplate(source, special_tokens, restricted=True)
            answer = ("ok", template.render(messages, add_generation_prompt, tools, **kwargs))
        except MemoryError:
            conn.send(("memory", ""))
            return  # the parent starts a fresh one
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(answer)


class RequestTemplateRenderer:
    """Renders request templates in a subprocess with a time and a memory limit."""

    def __init__(self, timeout_s: float = RENDER_TIMEOUT_S,
                 memory_bytes: int | None = MEMORY_LIMIT_BYTES,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.start_timeout_s = start_timeout_s
        self.processes_started = 0  # a killed subprocess is replaced: tests read this
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        # one thread: renders queue here, and a cancelled request's queued render never runs
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fd-template")
        atexit.register(self.close)

    async def render(self, source: str, special_tokens: Mapping[str, str] | None,
                     messages: list[dict[str, Any]], add_generation_prompt: bool,
                     tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]) -> str:
        """The prompt text; RenderError when the template fails, RenderLimitError past a
        limit, RuntimeError when the subprocess cannot start."""
        job = (source, dict(special_tokens or {}), messages, add_generation_prompt, tools, kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._render_blocking, job)

    def close(self) -> None:
        """Stop the subprocess (a later render starts a new one)."""
        self._kill()

    def _render_blocking(self, job: tuple[Any, ...]) -> str:
        conn = self._connection()
        try:
            conn.send(job)
            done = conn.poll(self.timeout_s)
            status, value = conn.recv() if done else ("timeout", "")
        except (EOFError, OSError):
            status, value = "died", ""
        if status == "ok":
            return str(value)
        if status == "error":
            raise RenderError(value)
        exitcode = self._kill(grace_s=0.0 if status == "timeout" else 1.0)
        if status == "timeout":
            raise RenderLimitError(
                f"chat_template: rendering exceeded the time limit of {self.timeout_s:g} s for a "
                "request's chat template and was stopped; use a template with fewer or shorter loops")
        if status == "memory" or exitcode == -signal.SIGKILL:
            raise RenderLimitError(
                f"chat_template: rendering exceeded the memory limit of {_mib(self.memory_bytes)} "
                "for a request's chat template and was stopped")
        raise RenderLimitError(f"chat_template: the process rendering the request's chat template "
                               f"ended (exit code {exitcode}) before answering; check the template")

    def _connection(self) -> Connection:
        if self._conn is not None and self._process is not None and self._process.poll() is None:
            return self._conn
        self._kill()
        ours, theirs = socket.socketpair()
        code = (f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; "
                "from fd_core.entrypoints.openai.template_sandbox import _child_main; _child_main()")
        args = [sys.executable, "-c", code, str(theirs.fileno()), str(self.memory_bytes or 0), str(os.getpid())]
        try:
            self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        except OSError as exc:
            ours.close()
            raise RuntimeError(f"could not start the process that renders request chat templates: {exc}") from None
        finally:
            theirs.close()
        self._conn = conn = Connection(ours.detach())
        self.processes_started += 1
        try:
            ready = conn.poll(self.start_timeout_s) and conn.recv()[0] == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            exitcode = self._kill()
            raise RuntimeError(f"the process that renders request chat templates did not start within "
                               f"{self.start_timeout_s:g} s (exit code {exitcode})")
        return conn

    def _kill(self, grace_s: float = 0.0) -> int | None:
        """Kill the subprocess if any (after ``grace_s`` to end by itself); its exit code
        (negative: the signal that ended it)."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is None:
            return None
        try:
            return process.wait(grace_s) if grace_s else process.wait(0)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()


def _child_main() -> None:
    """The subprocess's entry: ``<socket fd> <memory bytes, 0: none> <parent pid>``."""
    fd, memory_bytes, parent_pid = (int(a) for a in sys.argv[1:4])
    _serve(Connection(fd), memory_bytes or None, parent_pid)


def _mib(n: int | None) -> str:
    return "(none set)" if not n else f"{n / (1 << 20):g} MiB"


_shared: RequestTemplateRenderer | None = None
_shared_lock = threading.Lock()


def shared_renderer() -> RequestTemplateRenderer:
    """The API process's renderer: one render subprocess for every app in it."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = RequestTemplateRenderer()
        return _shared
