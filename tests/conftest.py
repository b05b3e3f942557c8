"""Shared fixtures: generated checkpoints (cached per session) and the CPU backend."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# FastDeploy's log files go to FD_LOG_DIR (default ./log); tests and the servers they start
# write theirs to a scratch directory, never into the repository
if "FD_LOG_DIR" not in os.environ:
    os.environ["FD_LOG_DIR"] = tempfile.mkdtemp(prefix="fd-test-logs-")
    atexit.register(shutil.rmtree, os.environ["FD_LOG_DIR"], True)


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory):
    """``make(shape, naming="pytorch", seed=0, **overrides) -> Path``, cached."""
    from fd_core.testing.checkpoints import generate_checkpoint

    cache: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("checkpoints")

    def make(shape: str, naming: str = "pytorch", seed: int = 0, **overrides) -> Path:
        key = (shape, naming, seed, tuple(sorted(overrides.items())))
        if key not in cache:
            out = root / f"{shape}-{naming}-{seed}-{len(cache)}"
            cache[key] = Path(generate_checkpoint(out, shape, naming=naming, seed=seed, **overrides))
        return cache[key]

    return make


@pytest.fixture(scope="session")
def cpu_backend():
    from fd_core.backends import get_backend

    backend = get_backend("cpu")
    backend.set_device(0)
    return backend
