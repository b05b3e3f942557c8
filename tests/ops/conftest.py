"""Shared fixture: the CPU backend's ops, device set once per session."""

from __future__ import annotations

import pytest

from fd_core.backends import Ops, get_backend


@pytest.fixture(scope="session")
def ops() -> Ops:
    backend = get_backend("cpu")
    backend.set_device(0)
    return backend.ops
