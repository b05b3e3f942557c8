"""Running the server: flag checks, the engine process, HTTP processes, exit codes.

Exit codes:
  0  stopped by SIGINT/SIGTERM with every request in flight finished
  1  the engine failed to start or died while serving, or the HTTP server could
     not listen or stopped by itself (the error is in the log)
  2  bad or unsupported flags (checked before anything is generated or loaded)
  3  stopped by SIGINT/SIGTERM, but requests still running after
     --timeout-graceful-shutdown (or at a second signal) were aborted with an error
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from typing import Any

__all__ = ["build_apps", "run_server", "setup_logging"]

logger = logging.getLogger("fd_core.serve")

BACKLOG = 2048  # uvicorn's default


def _fail(message: str, code: int) -> int:
    print(f"fd-serve: error: {message}", file=sys.stderr, flush=True)
    return code


def run_server(ns: argparse.Namespace) -> int:
    """Start the engine process and serve HTTP until stopped; returns the exit code."""
    try:
        setup_logging()
    except (OSError, ValueError) as exc:
        return _fail(f"logging: {exc}", 2)
    _log_environment()
    from fd_core.config import UnsupportedFeatureError
    from fd_core.entrypoints.cli import engine_args_from, server_kwargs_from

    demo = ns.model == "demo"
    if demo:  # checked against the demo's path; generated only once every flag is known to be good
        from fd_core.entrypoints.demo import DEFAULT_DIR

        ns.model = str(DEFAULT_DIR)
        if not ns.served_model_name:
            ns.served_model_name = ["demo"]
    try:
        workers, graceful_timeout = _lifecycle_flags(ns)
        from fd_core import envs

        envs.check_values()  # a bad FD_* value stops here, naming the variable
        engine_args = engine_args_from(ns)
        server_kwargs = server_kwargs_from(ns)
        from fd_core.cluster import scheduler_config_from

        scheduler = scheduler_config_from(ns)  # --scheduler-name global: fd_core.cluster
        if getattr(ns, "router", None):  # a bad --router stops here, naming it
            from fd_core.router.announce import router_url

            ns.router = router_url(ns.router)
        _check_server_args(server_kwargs)
        _check_parsers(ns)
        _check_backend(ns.backend)
    except (UnsupportedFeatureError, ValueError, TypeError) as exc:
        return _fail(str(exc), 2)
    if demo:
        from fd_core.entrypoints.demo import ensure_demo_checkpoint

        ensure_demo_checkpoint(DEFAULT_DIR)
    try:
        from fd_core.model_loader import resolve_model_path
        from fd_core.models.config import load_config
        from fd_core.parallel.config import check_expert_parallel, check_tensor_parallel

        model_config = load_config(resolve_model_path(engine_args.model, revision=engine_args.revision))
        check_tensor_parallel(model_config, engine_args.tensor_parallel_size)  # before any process starts
        if engine_args.enable_expert_parallel:
            check_expert_parallel(model_config, engine_args.tensor_parallel_size)
        if engine_args.ips:  # --ips: a host other than the first runs its ranks, not a server
            from fd_core.parallel.multinode import node_main

            node_code = node_main(engine_args.ips, engine_args.tensor_parallel_size, engine_args.backend)
            if node_code is not None:
                return node_code
    except (OSError, ValueError) as exc:
        return _fail(str(exc), 2)
    try:  # listening before the engine loads: a taken port fails in seconds, not after the model loads
        sockets = _bind(ns.host, [ns.port, *([ns.metrics_port] if ns.metrics_port else [])], workers)
    except OSError as exc:
        return _fail(f"cannot listen on {ns.host}: {exc}", 1)
    if workers > 1 and engine_args.data_parallel_size > 1:
        return _fail(f"--data-parallel-size {engine_args.data_parallel_size} with --workers {workers}: several "
                     "API processes over data-parallel replicas is not supported; use --workers 1", 2)
    if workers > 1:
        from fd_core.entrypoints.workers import run_workers

        return run_workers(ns, engine_args, server_kwargs, sockets, workers, graceful_timeout)

    from fd_core.engine.client import EngineDeadError
    from fd_core.engine.mp_engine import MPEngineClient

    logger.info("starting the engine process for %s", engine_args.model)
    try:
        if engine_args.data_parallel_size > 1:  # N replicas behind this one client (fd_core.engine.dp_client)
            from fd_core.engine.dp_client import DataParallelClient

            client: Any = DataParallelClient(engine_args)
        else:
            client = MPEngineClient(engine_args)
    except ValueError as exc:
        return _fail(str(exc), 2)
    except EngineDeadError as exc:
        logger.error("%s", exc)
        return 1
    if scheduler is not None:
        from fd_core.cluster.client import GlobalSchedulerClient
        from fd_core.cluster.instance import instance_url

        name = f"{socket.gethostname()}:{ns.port}"
        client = GlobalSchedulerClient(client, scheduler, default_name=name, url=instance_url(ns.host, ns.port))
        return _serve_global(client, ns, engine_args,
                             server_kwargs, sockets[0], graceful_timeout)
    try:
        return asyncio.run(_serve_one(client, ns, engine_args, server_kwargs, sockets[0], graceful_timeout))
    finally:
        client.close()


def _serve_global(client: Any, ns: argparse.Namespace, engine_args: Any, server_kwargs: dict[str, Any],
                  sockets: list[socket.socket], graceful_timeout: float) -> int:
    """Serve with --scheduler-name global: the engine client is fd_core.cluster's."""
    try:
        return asyncio.run(_serve_one(client, ns, engine_args, server_kwargs, sockets, graceful_timeout))
    finally:
        client.close()


def _check_server_args(server_kwargs: dict[str, Any]) -> None:
    """The HTTP layer's flags (ServerArgs) and --chat-template, before any model loads."""
    from fd_core.entrypoints.openai.api_server import ServerArgs

    ServerArgs(**server_kwargs)


def _lifecycle_flags(ns: argparse.Namespace) -> tuple[int, float]:
    """--workers and --timeout-graceful-shutdown, checked."""
    workers = getattr(ns, "workers", 1)
    workers = 1 if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--workers must be a positive integer, got {workers!r}")
    timeout = getattr(ns, "timeout_graceful_shutdown", 0)
    timeout = 0.0 if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < float("inf"):
        raise ValueError(f"--timeout-graceful-shutdown must be a number of seconds >= 0 (0: no limit), "
                         f"got {timeout!r}")
    return workers, float(timeout)


def _bind(host: str, ports: list[int], copies: int = 1) -> list[list[socket.socket]]:
    """Listening sockets on ``host``: ``copies`` lists, each with one socket per port.

    Several copies (``--workers``) share each port with SO_REUSEPORT, so the
    kernel spreads new connections evenly over the workers (one inherited
    socket would go to whichever worker wakes first). A plain bind first makes
    sure no other server holds the port, with or without SO_REUSEPORT.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    reuse_port = copies > 1 and hasattr(socket, "SO_REUSEPORT")
    made: list[socket.socket] = []

    def listen(port: int, shared: bool) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        made.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise OSError(exc.errno, f"port {port}: {exc.strerror}") from None
        sock.listen(BACKLOG)
        return sock

    try:
        if not reuse_port:
            first = [listen(port, False) for port in ports]
            return [first] * copies  # one socket, inherited by every copy
        for port in ports:
            listen(port, False).close()
        return [[listen(port, True) for port in ports] for _ in range(copies)]
    except OSError:
        for sock in made:
            sock.close()
        raise


def setup_logging(tag: str | None = None) -> None:
    """Logging of an API process: the console and FD_LOG_DIR's files (fd_core.logging_setup);
    ``tag`` (e.g. ``api-1``) marks each line of one of several workers."""
    try:
        from fd_core.logging_setup import setup_logging as setup
    except ImportError:  # pragma: no cover - a tree without log files
        logging.basicConfig(level=logging.INFO)
    else:
        setup("api_server")
    if tag is not None:
        fmt = logging.Formatter(f"%(asctime)s %(levelname)s [{tag}] %(name)s: %(message)s")
        for handler in logging.getLogger().handlers:
            handler.setFormatter(fmt)
    else:
        for handler in logging.getLogger().handlers:
            if handler.formatter is None:
                handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))


def _log_environment() -> None:
    """The FD_* variables that have no effect here, said once (when envs offers it)."""
    from fd_core import envs

    log_no_effect = getattr(envs, "log_no_effect", None)
    if log_no_effect is not None:
        log_no_effect(logger)


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


def build_apps(client: Any, ns: argparse.Namespace, engine_args: Any, server_kwargs: dict[str, Any],
               drain: Any, worker: int | None = None) -> list[Any]:
    """The main app (and the --metrics-port app), with the lifecycle middleware;
    raises ValueError for a bad server argument."""
    from fd_core.disagg.config import advertised_address
    from fd_core.entrypoints.lifecycle import LifecycleMiddleware
    from fd_core.entrypoints.openai.api_server import ServerArgs, build_app, build_metrics_app

    app = build_app(client, ServerArgs(**server_kwargs))
    app.state.fd.splitwise_role = (getattr(engine_args, "splitwise_role", None) or "mixed").strip().lower()
    app.state.fd.pd_addr = advertised_address(engine_args, ns.host)
    try:
        from fd_core.entrypoints.openai.config_info import config_info
    except ImportError:  # pragma: no cover - older tree without /config-info
        pass
    else:
        shown = {**server_kwargs, "host": ns.host, "port": ns.port,
                 "workers": getattr(ns, "workers", 1), "worker": worker,
                 "timeout_graceful_shutdown": getattr(ns, "timeout_graceful_shutdown", 0)}
        app.state.config_info = config_info(engine_args, shown, client.info.model_dir)
    app.add_middleware(LifecycleMiddleware, drain=drain, worker=worker)
    apps = [app]
    if ns.metrics_port:
        metrics_app = build_metrics_app(app)
        if worker is not None:  # its answers name the worker too (any worker shows the whole server)
            metrics_app.add_middleware(LifecycleMiddleware, drain=drain, worker=worker)
        apps.append(metrics_app)
    return apps


async def _serve_one(client: Any, ns: argparse.Namespace, engine_args: Any, server_kwargs: dict[str, Any],
                     sockets: list[socket.socket], graceful_timeout: float) -> int:
    from fd_core.entrypoints.lifecycle import Drain, serve_http

    drain = Drain()
    try:
        apps = build_apps(client, ns, engine_args, server_kwargs, drain)
    except ValueError as exc:
        await client.shutdown()
        return _fail(str(exc), 2)
    logger.info("serving %s on http://%s:%d (backend %s)", server_kwargs["served_model_names"],
                ns.host, ns.port, client.info.backend)
    announcer = _announce(ns)
    try:
        return await serve_http(client, list(zip(apps, sockets)), drain, graceful_timeout)
    finally:
        if announcer is not None:
            announcer.cancel()


def _announce(ns: argparse.Namespace) -> asyncio.Task | None:
    """fd-serve --router: register with fd-router and stay registered (fd_core.router.announce)."""
    if not getattr(ns, "router", None):
        return None
    from fd_core.router.announce import announce_forever, instance_info

    info = instance_info(ns.router, ns.host, ns.port, getattr(ns, "splitwise_role", None) or "mixed")
    return asyncio.get_running_loop().create_task(announce_forever(ns.router, info))
