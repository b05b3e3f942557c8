"""setup_logging: FastDeploy's log files under FD_LOG_DIR, FD_DEBUG / FD_LOG_LEVEL."""

from __future__ import annotations

import logging

import pytest

from fd_core import envs
from fd_core.logging_setup import reset_logging, setup_logging


@pytest.fixture
def log_env(tmp_path, monkeypatch):
    """A private FD_LOG_DIR; logging state put back afterwards."""
    for name in ("FD_LOG_LEVEL", "FD_DEBUG", "FD_LOG_BACKUP_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FD_LOG_DIR", str(tmp_path / "logs"))
    envs.reset()
    root, fd = logging.getLogger(), logging.getLogger("fd_core")
    saved = root.level, fd.level
    yield tmp_path / "logs", monkeypatch
    reset_logging()
    root.setLevel(saved[0])
    fd.setLevel(saved[1])
    envs.reset()


def read(path):
    for handler in logging.getLogger().handlers:
        handler.flush()
    return path.read_text() if path.exists() else ""


def test_engine_files(log_env):
    log_dir, env = log_env
    env.setenv("FD_API_KEY", "secret-key")
    envs.reset()
    assert setup_logging("engine", console=False) == log_dir
    logging.getLogger("fd_core.engine.scheduler").info("scheduled 3 requests")
    logging.getLogger("fd_core.engine.block_pool").info("evicted a block")
    logging.getLogger("fd_core.engine.model_runner").info("loaded weights")
    logging.getLogger("fd_core.engine.scheduler").debug("per-step detail")
    logging.getLogger("some.library").warning("library says")
    assert "scheduled 3 requests" in read(log_dir / "scheduler.log")
    assert "evicted a block" in read(log_dir / "cache_manager.log")
    assert "loaded weights" in read(log_dir / "gpu_model_runner.log")
    main = read(log_dir / "fastdeploy.log")
    assert all(s in main for s in ("scheduled 3", "evicted", "loaded")) and "library says" not in main
    assert "library says" in read(log_dir / "workerlog.0") and "[engine]" in main
    assert "per-step detail" not in main  # INFO by default
    assert "scheduled 3 requests" in read(log_dir / "console.log")
    envlog = read(log_dir / "envlog.0").splitlines()
    assert "FD_API_KEY=***" in envlog and f"FD_LOG_DIR={log_dir}" in envlog and "secret-key" not in str(envlog)
    assert not (log_dir / "api_server.log").exists()


def test_api_server_files(log_env):
    log_dir, _ = log_env
    setup_logging("api_server", console=False)
    logging.getLogger("fd_core.entrypoints.openai").info("req-1 done")
    logging.getLogger("fd_core.tokenizer").info("decoded")
    assert "req-1 done" in read(log_dir / "api_server.log")
    assert "decoded" in read(log_dir / "data_processor.log")
    assert not (log_dir / "fastdeploy.log").exists()


@pytest.mark.parametrize("env,debug_shown", [({"FD_DEBUG": "1"}, True),
                                             ({"FD_DEBUG": "1", "FD_LOG_LEVEL": "INFO"}, False)])
def test_fd_debug_and_fd_log_level(log_env, env, debug_shown):
    log_dir, monkeypatch = log_env
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    envs.reset()
    setup_logging("llm", console=False)
    logging.getLogger("fd_core.engine.scheduler").debug("per-step detail")
    assert ("per-step detail" in read(log_dir / "fastdeploy.log")) is debug_shown
    assert logging.getLogger().level == logging.INFO  # libraries never drop to DEBUG


def test_calling_again_replaces_the_handlers(log_env):
    log_dir, _ = log_env
    setup_logging("llm", console=False)
    setup_logging("llm", console=False)
    logging.getLogger("fd_core.x").info("once")
    assert read(log_dir / "fastdeploy.log").count("once") == 1
    with pytest.raises(ValueError, match="unknown logging component 'worker'"):
        setup_logging("worker")
