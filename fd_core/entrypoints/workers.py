"""``fd-serve --workers N`` (N > 1): N API processes in front of one engine process.

The main process checks the flags, binds the listening sockets, starts the
engine process, then spawns N API worker processes. Each worker gets its own
listening socket on the same port (SO_REUSEPORT: the kernel spreads new
connections evenly over them; one shared socket where that option is missing),
attaches to the engine over its IPC socket, and runs the HTTP app with its own
tokenizer, output processor and per-request metrics; the engine routes each
request's outputs back to the worker that sent it and its stats to all. An
answer names its worker in the ``x-fd-worker`` header (0 .. N-1). The workers
keep their metrics in one directory the main process makes for the run and
removes at exit (``fd_core.metrics.multiprocess``), so /metrics, answered by
any worker, shows the whole server.

The main process only supervises:
- SIGINT/SIGTERM: SIGTERM to every worker, each drains as a single server
  does (see ``lifecycle``); a second signal: SIGUSR1, cut now. Once all have
  exited, the engine is told to stop.
- the engine dies: the workers are told, fail their requests and exit; exit 1.
- a worker exits by itself: the others are drained and stopped; exit 1 (2 if
  it found a bad server flag while starting).
- the main process is SIGKILLed: the engine and the workers see that their
  parent is gone and exit.
The exit code follows serve.py's table: the worst of the workers'.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import time
from multiprocessing.connection import wait
from typing import Any

__all__ = ["run_workers"]

logger = logging.getLogger("fd_core.serve")

POLL_SECONDS = 0.5
STOP_MARGIN_SECONDS = 30.0  # beyond a worker's own drain limits before it is killed


def run_workers(ns: argparse.Namespace, engine_args: Any, server_kwargs: dict[str, Any],
                sockets: list[list[socket.socket]], n: int, graceful_timeout: float) -> int:
    """Start the engine and ``n`` API workers, worker i listening on ``sockets[i]``;
    returns the exit code."""
    from fd_core.engine.client import EngineDeadError
    from fd_core.engine.engine_process import (
        EngineProcessView,
        start_engine_process,
        stop_engine_process,
    )
    from fd_core.metrics import multiprocess

    ctx = multiprocessing.get_context("spawn")
    logger.info("starting the engine process for %s", engine_args.model)
    try:
        engine, endpoint, socket_dir = start_engine_process(engine_args)
    except EngineDeadError as exc:
        logger.error("%s", exc)
        _close(sockets)
        return 1
    view = EngineProcessView(endpoint.pid, os.getpid(), ctx.Event(), ctx.Value("i", -1))
    limit = server_kwargs.get("max_concurrency")
    if limit:  # --max-concurrency is for the server: each worker takes its share (as FastDeploy does)
        server_kwargs = {**server_kwargs, "max_concurrency": -(-limit // n)}
    workers: list[Any] = []
    metrics_dir = ""
    try:
        metrics_dir = multiprocess.make_shared_dir()
        with multiprocess.worker_environment(metrics_dir):
            for i in range(n):
                proc = ctx.Process(target=_worker_main, name=f"fd-api-{i}", args=(
                    i, ns, engine_args, server_kwargs, endpoint, view, sockets[i], graceful_timeout, metrics_dir))
                proc.start()
                workers.append(proc)
        _close(sockets)  # the workers hold their own copies
        logger.info("serving %s on http://%s:%d with %d API workers (pids %s) and one engine (backend %s)",
                    server_kwargs["served_model_names"], ns.host, ns.port, n,
                    ", ".join(str(p.pid) for p in workers), endpoint.info.backend)
        return _Supervisor(engine, view, workers, graceful_timeout).run()
    finally:
        for proc in workers:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        stop_engine_process(engine, endpoint.address)
        shutil.rmtree(socket_dir, ignore_errors=True)
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _close(sockets: list[list[socket.socket]]) -> None:
    for group in sockets:
        for sock in group:
            sock.close()


class _Supervisor:
    def __init__(self, engine: Any, view: Any, workers: list[Any], graceful_timeout: float) -> None:
        from fd_core.entrypoints.lifecycle import CUT_FLUSH_SECONDS, UVICORN_BACKSTOP_SECONDS

        self.engine = engine
        self.view = view
        self.workers = workers
        self.graceful_timeout = graceful_timeout
        self.after_cut = CUT_FLUSH_SECONDS + UVICORN_BACKSTOP_SECONDS + STOP_MARGIN_SECONDS
        self.signals: list[int] = []
        self.handled = 0  # stop signals passed on to the workers
        self.deadline: float | None = None  # kill the workers still running after this
        self.failure: int | None = None  # exit code when something broke

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _frame: self.signals.append(signum))
        while any(p.exitcode is None for p in self.workers):
            wait([p.sentinel for p in self.workers if p.exitcode is None] + [self.engine.sentinel],
                 timeout=POLL_SECONDS)
            self._pass_signals()
            self._check_engine()
            self._check_workers()
            if self.deadline is not None and time.monotonic() > self.deadline:
                logger.error("API workers still running %g s after the stop; killing them", self.after_cut)
                for proc in self.workers:
                    if proc.exitcode is None:
                        proc.kill()
                self.failure = self.failure or 1
                self.deadline = None
        codes = [p.exitcode for p in self.workers]
        if self.failure is not None:
            return self.failure
        if all(code in (0, 3) for code in codes):
            return 3 if 3 in codes else 0
        return 1

    def _stop_workers(self, sig: int) -> None:
        for proc in self.workers:
            if proc.exitcode is None:
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def _pass_signals(self) -> None:
        while len(self.signals) > self.handled:
            self.handled += 1
            if self.handled == 1:
                logger.info("stopping: the API workers drain their requests")
                self._stop_workers(signal.SIGTERM)
                if self.graceful_timeout > 0:
                    self.deadline = time.monotonic() + self.graceful_timeout + self.after_cut
            else:
                logger.info("stopping now: the API workers abort what is still running")
                self._stop_workers(signal.SIGUSR1)
                self.deadline = time.monotonic() + self.after_cut

    def _check_engine(self) -> None:
        if self.engine.exitcode is not None and not self.view.dead.is_set():
            logger.error("the engine process died (exit code %s); stopping the API workers", self.engine.exitcode)
            self.view.mark_dead(self.engine.exitcode)  # the workers fail their requests and exit 1
            self.failure = 1

    def _check_workers(self) -> None:
        if self.handled or self.failure is not None:
            return
        for proc in self.workers:
            if proc.exitcode is not None:
                logger.error("API worker %s (pid %d) exited with code %s; stopping the server",
                             proc.name, proc.pid, proc.exitcode)
                self.failure = proc.exitcode if proc.exitcode in (1, 2) else 1
                self.signals.append(signal.SIGTERM)  # drain the others
                self._pass_signals()
                return


def _worker_main(index: int, ns: argparse.Namespace, engine_args: Any, server_kwargs: dict[str, Any],
                 endpoint: Any, view: Any, sockets: list[socket.socket], graceful_timeout: float,
                 metrics_dir: str) -> None:
    """Main of API worker ``index``: attach to the engine and serve until stopped;
    its metrics go to ``metrics_dir``, shared by all workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the whole group; the main process decides
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped before serving: nothing to drain
    from fd_core.engine.mp_engine import MPEngineClient
    from fd_core.entrypoints.serve import setup_logging

    # a library logging through the root logger while this process unpickled its arguments has
    # installed logging's default handler; this process is ours alone: start clean
    logging.getLogger().handlers.clear()
    setup_logging(f"api-{index}")  # the main process has checked that it works

    try:
        from fd_core.metrics import multiprocess

        multiprocess.enable(metrics_dir)  # before build_apps makes this worker's Metrics
        client: Any = MPEngineClient(engine_args, endpoint=endpoint, process=view)
        from fd_core.cluster.instance import worker_client

        client = worker_client(client, ns, index)  # --scheduler-name global: each worker is an instance
    except Exception:
        logger.exception("API worker %d could not start", index)
        sys.exit(1)
    try:
        code = asyncio.run(_serve_worker(index, client, ns, engine_args, server_kwargs, sockets, graceful_timeout))
    finally:
        client.close()
    sys.exit(code)


async def _serve_worker(index: int, client: Any, ns: argparse.Namespace, engine_args: Any,
                        server_kwargs: dict[str, Any], sockets: list[socket.socket], graceful_timeout: float) -> int:
    from fd_core.entrypoints.lifecycle import Drain, serve_http
    from fd_core.entrypoints.serve import _announce, build_apps

    drain = Drain()
    try:
        apps = build_apps(client, ns, engine_args, server_kwargs, drain, worker=index)
    except ValueError as exc:
        print(f"fd-serve: error: {exc}", file=sys.stderr, flush=True)
        await client.shutdown()
        return 2
    announcer = _announce(ns) if index == 0 else None  # fd-serve --router: one registration per instance
    try:
        return await serve_http(client, list(zip(apps, sockets)), drain, graceful_timeout, worker=True)
    finally:
        if announcer is not None:
            announcer.cancel()
