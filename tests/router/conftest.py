"""Fixtures of the router tests: fake instances and a router, each served by uvicorn in a thread."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fd_core.router.app import build_app
from fd_core.router.config import RouterConfig
from tests.cluster.conftest import redis_server  # noqa: F401  (a real redis-server, for discovery)
from tests.router.fakes import FakeInstance, ServerThread

FAST = dict(health_check_interval_secs=0.05, health_check_timeout_secs=2.0, load_poll_interval_secs=0.05,
            health_failure_threshold=2, health_success_threshold=2)


@pytest.fixture
def fakes() -> Iterator[Any]:
    made: list[FakeInstance] = []

    def make(name: str, **kw: Any) -> FakeInstance:
        inst = FakeInstance(name, **kw)
        made.append(inst)
        return inst

    yield make
    for inst in made:
        inst.stop()


@pytest.fixture
def router() -> Iterator[Any]:
    made: list[ServerThread] = []

    def make(**kw: Any) -> ServerThread:
        server = ServerThread(build_app(RouterConfig(**{**FAST, **kw})))
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()
