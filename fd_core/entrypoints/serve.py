"""Running the server: engine process, HTTP app, lifecycle and exit codes.

Exit codes: 0 after a normal shutdown (SIGINT/SIGTERM), 1 when the engine
fails to start or dies while serving (its error is in the log), 2 for bad
or unsupported flags.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

__all__ = ["run_server"]

logger = logging.getLogger("fd_core.serve")


def _fail(message: str, code: int) -> int:
    print(f"fd-serve: error: {message}", file=sys.stderr, flush=True)
    return code


def run_server(ns: argparse.Namespace) -> int:
    """Start the engine process and serve HTTP until stopped; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from fd_core.config import UnsupportedFeatureError
    from fd_core.entrypoints.cli import engine_args_from, server_kwargs_from

    served_default = ns.model
    if ns.model == "demo":
        from fd_core.entrypoints.demo import DEFAULT_DIR, ensure_demo_checkpoint

        ns.model = str(ensure_demo_checkpoint(DEFAULT_DIR))
        if not ns.served_model_name:
            ns.served_model_name = [served_default]
    try:
        engine_args = engine_args_from(ns)
        server_kwargs = server_kwargs_from(ns)
        _check_parsers(ns)
        _check_backend(ns.backend)
    except UnsupportedFeatureError as exc:
        return _fail(str(exc), 2)
    except (ValueError, TypeError) as exc:
        return _fail(str(exc), 2)
    try:
        from fd_core.model_loader import resolve_model_path
        from fd_core.models.config import load_config

        load_config(resolve_model_path(engine_args.model))
    except (OSError, ValueError) as exc:
        return _fail(str(exc), 2)

    from fd_core.engine.client import EngineDeadError
    from fd_core.engine.mp_engine import MPEngineClient

    logger.info("starting the engine process for %s", engine_args.model)
    try:
        client = MPEngineClient(engine_args)
    except EngineDeadError as exc:
        logger.error("%s", exc)
        return 1
    try:
        return asyncio.run(_serve(client, ns, server_kwargs))
    finally:
        if client.process.is_alive():
            client.process.kill()


def _check_backend(name: str) -> None:
    """A named backend must be installed, importable and usable here (a bad
    --backend is a flag error, not an engine start-up failure)."""
    if name == "auto":
        return
    from fd_core.backends import BackendSelectionError, get_backend
    from fd_core.plugins.manager import PluginLoadError

    try:
        get_backend(name)
    except (BackendSelectionError, PluginLoadError) as exc:
        raise ValueError(f"--backend {name}: {exc}") from None


def _check_parsers(ns: argparse.Namespace) -> None:
    if not (ns.reasoning_parser or ns.tool_call_parser):
        return
    from fd_core.parsers import ReasoningParserManager, ToolParserManager

    if ns.reasoning_parser:
        ReasoningParserManager.get(ns.reasoning_parser)
    if ns.tool_call_parser:
        ToolParserManager.get(ns.tool_call_parser)


async def _serve(client: Any, ns: argparse.Namespace, server_kwargs: dict[str, Any]) -> int:
    import uvicorn

    from fd_core.entrypoints.openai.api_server import ServerArgs, build_app, build_metrics_app

    app = build_app(client, ServerArgs(**server_kwargs))
    servers = [uvicorn.Server(uvicorn.Config(app, host=ns.host, port=ns.port, log_level="info",
                                             timeout_graceful_shutdown=5))]
    if ns.metrics_port:
        servers.append(uvicorn.Server(uvicorn.Config(
            build_metrics_app(app), host=ns.host, port=ns.metrics_port, log_level="warning")))
    for server in servers:
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign,attr-defined]
    exit_code = 0
    stopping = asyncio.Event()

    def stop(*_: Any) -> None:
        stopping.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)

    async def watch_engine() -> None:
        nonlocal exit_code
        while not stopping.is_set():
            if client.dead:
                logger.error("the engine process died (exit code %s); shutting the server down",
                             client.process.exitcode)
                exit_code = 1
                stopping.set()
                return
            await asyncio.sleep(0.5)

    tasks = [asyncio.create_task(s.serve()) for s in servers]
    watcher = asyncio.create_task(watch_engine())
    logger.info("serving %s on http://%s:%d (backend %s)", server_kwargs["served_model_names"],
                ns.host, ns.port, client.info.backend)
    done_waiter = asyncio.create_task(stopping.wait())
    finished, _ = await asyncio.wait([*tasks, done_waiter], return_when=asyncio.FIRST_COMPLETED)
    if any(t in finished for t in tasks) and not stopping.is_set():
        exit_code = exit_code or 1  # a server stopped by itself (e.g. the port is taken)
        logger.error("the HTTP server stopped unexpectedly")
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)
    watcher.cancel()
    await client.shutdown()
    return exit_code
