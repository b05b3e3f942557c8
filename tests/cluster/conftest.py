"""Fixtures of the cluster tests: a real redis-server (skipped, saying why, when the binary is missing)."""

from __future__ import annotations

import pytest

from tests.cluster.redis_server import REDIS_SERVER, RedisServer


@pytest.fixture
def redis_server(tmp_path):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install -y redis-server)")
    server = RedisServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()
