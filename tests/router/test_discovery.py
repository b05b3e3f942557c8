"""Instances found in the global scheduler's Redis registry (a real redis-server), read only."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from fd_core.cluster.config import GlobalSchedulerConfig
from fd_core.cluster.store import RedisStore
from fd_core.router.discovery import url_of
from tests.router.fakes import registered, wait_for


def _as_instance(port: int, name: str, action: str, load: dict[str, Any] | None = None) -> None:
    """Join, beat or leave the topic as fd-serve --scheduler-name global does (fd_core.cluster.store)."""
    async def run() -> None:
        store = RedisStore(GlobalSchedulerConfig(port=port, topic="t1", expire_period_ms=60_000), name)
        try:
            if action == "join":
                assert await store.claim_name()
                await store.heartbeat(load or {"running": 0, "waiting": 0})
            else:
                await store.leave()
        finally:
            await store.close()
    asyncio.run(run())


def test_url_of_a_redis_instance():
    assert url_of("127.0.0.1:8000", None) == "http://127.0.0.1:8000"
    assert url_of("box-3", {"url": "http://10.0.0.3:8180"}) == "http://10.0.0.3:8180"
    assert url_of("box-3", {}) is None


def test_the_router_follows_the_instances_in_redis(fakes, router, redis_server):
    a, b = fakes("a"), fakes("b")
    _as_instance(redis_server.port, f"127.0.0.1:{a.server.port}", "join")
    _as_instance(redis_server.port, "elsewhere", "join", {"url": b.url, "running": 0})
    r = router(scheduler_host="127.0.0.1", scheduler_port=redis_server.port, scheduler_topic="t1",
               redis_poll_interval_secs=0.05)
    wait_for(lambda: set(registered(r.url)) == {a.url, b.url}, what="both instances found")
    assert {i["source"] for i in registered(r.url).values()} == {"redis"}
    answers = {httpx.post(r.url + "/v1/completions", json={"prompt": "p"}, timeout=10).json()["instance"]
               for _ in range(4)}
    assert answers == {"a", "b"}
    keys_before = asyncio.run(_keys(redis_server.port))
    _as_instance(redis_server.port, f"127.0.0.1:{a.server.port}", "leave")
    wait_for(lambda: set(registered(r.url)) == {b.url}, what="a gone")
    assert asyncio.run(_keys(redis_server.port)) == keys_before - {f"fd:t1:ins:127.0.0.1:{a.server.port}"}


def test_redis_down_keeps_the_instances_known_and_says_so(fakes, router, redis_server):
    a = fakes("a")
    _as_instance(redis_server.port, f"127.0.0.1:{a.server.port}", "join")
    r = router(scheduler_host="127.0.0.1", scheduler_port=redis_server.port, scheduler_topic="t1",
               redis_poll_interval_secs=0.05)
    wait_for(lambda: a.url in registered(r.url), what="a found")
    redis_server.stop()
    wait_for(lambda: httpx.get(r.url + "/registered", timeout=5).json()["redis"]["error"] is not None,
             what="the Redis error reported")
    assert httpx.post(r.url + "/v1/completions", json={"prompt": "p"}, timeout=10).json()["instance"] == "a"


async def _keys(port: int) -> set[str]:
    import redis.asyncio as aioredis

    client = aioredis.Redis(port=port, decode_responses=True)
    try:
        return {str(k) for k in await client.keys("*")}
    finally:
        await client.aclose()


def test_api_workers_advertise_their_server_url():
    """``fd-serve --workers N --scheduler-name global``: each worker is an instance named
    ``host:port-wI`` (not a URL), so its heartbeat carries the server's URL."""
    from types import SimpleNamespace

    from fd_core.cluster.instance import instance_url, worker_client

    inner = SimpleNamespace(info=SimpleNamespace(max_num_seqs=8), tokenizer=None)
    ns = SimpleNamespace(scheduler_name="global", workers=2, port=8180, host="127.0.0.1")
    client = worker_client(inner, ns, 1)  # type: ignore[arg-type]
    assert client.base_name.endswith(":8180-w1") and url_of(client.base_name, None) is None
    assert instance_url("127.0.0.1", 8180) == "http://127.0.0.1:8180"
    assert client.url == "http://127.0.0.1:8180"
    assert url_of(client.base_name, {"url": client.url}) == "http://127.0.0.1:8180"
