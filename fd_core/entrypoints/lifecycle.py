"""One HTTP serving process: uvicorn, the engine watch, and graceful shutdown.

On the first stop signal the process stops taking generation requests (they
get a JSON 503 "The server is shutting down"; /health and /ping answer 503,
so load balancers stop sending), and waits for the generation requests in
flight to finish, for at most ``--timeout-graceful-shutdown`` seconds (0: no
limit). Requests still running then are aborted through the engine client,
so their own handlers answer: a JSON 503 error, or for a stream that has
started an SSE error event and ``data: [DONE]``. Only then is uvicorn told
to exit. A second stop signal skips the wait and cuts at once.

uvicorn's own signal handling is off: its timeout cancels handler tasks,
which gives a bare text/plain 500 or a stream cut without an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fd_core.entrypoints.aio import wait_within
from fd_core.entrypoints.openai.errors import OpenAIError, error_response

__all__ = ["EXIT_CUT", "Drain", "LifecycleMiddleware", "serve_http"]

logger = logging.getLogger("fd_core.serve")

EXIT_OK, EXIT_ENGINE, EXIT_CUT = 0, 1, 3  # 2 (bad flags) is decided before serving
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
HEALTH_PATHS = ("/health", "/ping")
CUT_FLUSH_SECONDS = 10.0  # aborted handlers get this long to send their error answers
UVICORN_BACKSTOP_SECONDS = 3  # then uvicorn cancels whatever is still running (a stuck client)
WATCH_SECONDS = 0.5


class Drain:
    """Generation requests in flight and whether new ones are refused."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float | None) -> bool:
        """True once nothing is in flight, False if ``timeout`` seconds pass first."""
        try:
            await wait_within(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


class LifecycleMiddleware:
    """Counts generation requests in flight (a stream until its last byte), refuses
    new ones and fails health checks while draining; with several API workers,
    names the one that answered in an ``x-fd-worker`` header."""

    def __init__(self, app: ASGIApp, drain: Drain, worker: int | None = None) -> None:
        self.app = app
        self.drain = drain
        self.worker_header = (b"x-fd-worker", str(worker).encode()) if worker is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.worker_header is not None:
            send = self._with_header(send)
        path = scope["path"]
        generation = scope["method"] == "POST" and path in GENERATION_PATHS
        if self.drain.draining and (generation or path in HEALTH_PATHS):
            message = ("The server is shutting down and takes no new requests; retry on another instance"
                       if generation else "The server is shutting down")
            await error_response(message, 503, headers={"Connection": "close"})(scope, receive, send)
            return
        if not generation:
            await self.app(scope, receive, send)
            return
        self.drain.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.leave()

    def _with_header(self, send: Send) -> Send:
        header = self.worker_header

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        return send_with_header


class _Server(uvicorn.Server):
    """uvicorn without its signal handling: ``serve_http`` drains, then sets should_exit."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29
        yield


async def serve_http(client: Any, listeners: list[tuple[ASGIApp, socket.socket]], drain: Drain,
                     graceful_timeout: float, *, worker: bool = False) -> int:
    """Serve each (app, bound socket) until stopped; returns the exit code.

    ``worker``: this is one of several API processes: SIGTERM drains (repeats are
    no-ops), SIGUSR1 cuts at once, SIGINT is left to the main process, and the
    process stops at once if the main process disappears. Otherwise SIGINT and
    SIGTERM drain and a second one cuts at once.
    """
    client.start()
    # log_config=None: uvicorn's lines go through this process's handlers (console, api_server.log)
    servers = [_Server(uvicorn.Config(app, log_config=None, log_level="info",
                                      timeout_graceful_shutdown=UVICORN_BACKSTOP_SECONDS))
               for app, _ in listeners]
    tasks = [asyncio.create_task(server.serve(sockets=[sock])) for server, (_, sock) in zip(servers, listeners)]
    stop, force = asyncio.Event(), asyncio.Event()
    _install_signals(stop, force, worker)
    parent = os.getppid() if worker else None
    stopper = asyncio.create_task(stop.wait())
    watcher = asyncio.create_task(_watch(client, parent))
    await asyncio.wait([*tasks, stopper, watcher], return_when=asyncio.FIRST_COMPLETED)
    exit_code = EXIT_OK
    if watcher.done():
        exit_code = EXIT_ENGINE
        if watcher.result() == "parent":
            logger.error("the main server process is gone; stopping this API worker")
        else:
            logger.error("the engine process died (exit code %s); shutting the server down",
                         client.process.exitcode)
    elif any(t.done() for t in tasks):
        exit_code = EXIT_ENGINE  # a server stopped by itself (e.g. it could not start)
        logger.error("the HTTP server stopped unexpectedly")
    elif await _drain(client, drain, graceful_timeout, force, watcher):
        exit_code = EXIT_ENGINE if client.dead else EXIT_CUT
    stopper.cancel()
    watcher.cancel()
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.shutdown()
    return exit_code


def _install_signals(stop: asyncio.Event, force: asyncio.Event, worker: bool) -> None:
    loop = asyncio.get_running_loop()

    def on_stop() -> None:
        if stop.is_set() and not worker:
            force.set()
        stop.set()

    def on_force() -> None:
        stop.set()
        force.set()

    if worker:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the whole group; the main process decides
        loop.add_signal_handler(signal.SIGTERM, on_stop)
        loop.add_signal_handler(signal.SIGUSR1, on_force)
    else:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_stop)


async def _watch(client: Any, parent: int | None) -> str:
    while True:
        if client.dead:
            return "engine"
        if parent is not None and os.getppid() != parent:
            return "parent"
        await asyncio.sleep(WATCH_SECONDS)


async def _drain(client: Any, drain: Drain, timeout: float, force: asyncio.Event, watcher: asyncio.Task) -> bool:
    """Refuse new requests, let those in flight finish; True if some had to be cut."""
    drain.draining = True
    limit = f"up to {timeout:g} s" if timeout > 0 else "without a time limit (--timeout-graceful-shutdown 0)"
    logger.info("shutting down: no new requests; waiting %s for %d in flight (a second signal cuts them now)",
                limit, drain.in_flight)
    idle = asyncio.create_task(drain.wait_idle(timeout if timeout > 0 else None))
    forced = asyncio.create_task(force.wait())
    await asyncio.wait([idle, forced, watcher], return_when=asyncio.FIRST_COMPLETED)
    forced.cancel()
    if idle.done() and idle.result():
        return False
    idle.cancel()
    if watcher.done():  # the engine died meanwhile: every waiter already got its error
        await drain.wait_idle(CUT_FLUSH_SECONDS)
        return True
    why = ("the server was told to stop at once" if force.is_set()
           else f"it did not finish within --timeout-graceful-shutdown {timeout:g} s")
    error = OpenAIError(f"The server is shutting down: this request was aborted because {why}.", 503)
    count = await client.abort_all(error)
    logger.warning("shutting down: aborted %d request(s) still running (%s)", count,
                   "a second stop signal" if force.is_set() else f"--timeout-graceful-shutdown {timeout:g} s")
    if not await drain.wait_idle(CUT_FLUSH_SECONDS):
        logger.error("%d request(s) did not answer their abort within %g s; closing them",
                     drain.in_flight, CUT_FLUSH_SECONDS)
    return True
