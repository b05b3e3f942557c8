"""``setup_logging(component)``: the console and FastDeploy's log files.

Like FastDeploy, every process writes its log files under ``FD_LOG_DIR``
(default ``./log``), with FastDeploy's file names (docs/usage/log.md):

| file                   | written by        | what                                                 |
|------------------------|-------------------|------------------------------------------------------|
| ``api_server.log``     | api_server        | everything the API process logs (requests, start-up) |
| ``fastdeploy.log``     | engine, llm       | everything fd_core logs in the engine                |
| ``workerlog.0``        | engine, llm       | everything the engine process logs, libraries too    |
| ``scheduler.log``      | engine, llm       | the scheduler (per-step lines at DEBUG)              |
| ``cache_manager.log``  | engine, llm       | KV cache manager and block pool                      |
| ``gpu_model_runner.log`` | engine, llm     | model runner, checkpoint loading                     |
| ``data_processor.log`` | all               | tokenizer, detokenizer, output processing            |
| ``console.log``        | all               | a copy of what the process prints on the console     |
| ``envlog.0``           | engine, llm       | the FD_* environment at start-up, secrets masked     |

Files only the engine writes rotate daily, keeping ``FD_LOG_BACKUP_COUNT``
days; files several processes share (``--workers``) are appended to.
The level is ``FD_LOG_LEVEL`` when set, else DEBUG with ``FD_DEBUG=1``, else
INFO; it applies to fd_core's loggers (libraries stay at INFO or above).
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

from fd_core import envs

__all__ = ["COMPONENTS", "log_level", "reset_logging", "setup_logging"]

COMPONENTS = ("api_server", "engine", "llm")
# file -> logger-name prefixes routed to it
_ROUTES: dict[str, tuple[str, ...]] = {
    "scheduler.log": ("fd_core.engine.scheduler",),
    "cache_manager.log": ("fd_core.engine.kv_cache_manager", "fd_core.engine.block_pool"),
    "gpu_model_runner.log": ("fd_core.engine.model_runner", "fd_core.model_loader", "fd_core.models"),
}
_DATA_PROCESSOR = ("fd_core.tokenizer", "fd_core.engine.frontend", "fd_core.engine.output_processor")
_MARK = "_fd_core_handler"


class _Prefixes(logging.Filter):
    """Pass records whose logger name starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.startswith(self.prefixes)


def log_level() -> int:
    """The level of fd_core's loggers: FD_LOG_LEVEL, else FD_DEBUG, else INFO."""
    named = envs.get("FD_LOG_LEVEL")
    if named:
        return int(getattr(logging, named))
    return logging.DEBUG if envs.get("FD_DEBUG") else logging.INFO


def reset_logging() -> None:
    """Remove (and close) every handler ``setup_logging`` installed."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False):
            root.removeHandler(handler)
            handler.close()


def _add(handler: logging.Handler, fmt: logging.Formatter, prefixes: tuple[str, ...] | None = None) -> None:
    handler.setFormatter(fmt)
    if prefixes:
        handler.addFilter(_Prefixes(prefixes))
    setattr(handler, _MARK, True)
    logging.getLogger().addHandler(handler)


def setup_logging(component: str, console: bool = True) -> Path:
    """Configure logging for this process and return the log directory.

    ``component`` is ``"api_server"`` (an API server process), ``"engine"``
    (the engine process behind a server) or ``"llm"`` (the offline ``LLM``,
    engine in process). Call it once, early, in each process; calling again
    replaces what an earlier call installed. ``console=False`` leaves the
    console to the caller (the offline API when the application has its own
    logging: check ``logging.getLogger().handlers`` first). Raises ValueError
    for an unknown component or a bad FD_LOG_* value, OSError when the log
    directory cannot be created.
    """
    if component not in COMPONENTS:
        raise ValueError(f"unknown logging component {component!r}; expected one of {', '.join(COMPONENTS)}")
    level = log_level()
    log_dir = Path(envs.get("FD_LOG_DIR")).expanduser()
    log_dir.mkdir(parents=True, exist_ok=True)
    keep = envs.get("FD_LOG_BACKUP_COUNT")
    tag = " [engine]" if component == "engine" else ""
    fmt = logging.Formatter(f"%(asctime)s %(levelname)s{tag} %(name)s: %(message)s")

    reset_logging()
    root = logging.getLogger()
    root.setLevel(max(level, logging.INFO))
    logging.getLogger("fd_core").setLevel(level)

    def rotating(name: str) -> logging.Handler:
        return logging.handlers.TimedRotatingFileHandler(
            log_dir / name, when="midnight", backupCount=keep, encoding="utf-8", delay=True)

    def shared(name: str) -> logging.Handler:
        return logging.FileHandler(log_dir / name, mode="a", encoding="utf-8", delay=True)

    if console:
        _add(logging.StreamHandler(sys.stderr), fmt)
    _add(shared("console.log"), fmt)
    _add(shared("data_processor.log"), fmt, _DATA_PROCESSOR)
    if component == "api_server":
        _add(shared("api_server.log"), fmt)
    else:
        _add(rotating("fastdeploy.log"), fmt, ("fd_core",))
        _add(rotating("workerlog.0"), fmt)
        for name, prefixes in _ROUTES.items():
            _add(rotating(name), fmt, prefixes)
        _write_envlog(log_dir / "envlog.0")
    return log_dir


def _write_envlog(path: Path) -> None:
    lines = [f"{name}={value}" for name, value in envs.environment().items()]
    path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
