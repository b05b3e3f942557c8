"""The instance side: fd-serve's GET /load and the --router registration (fd_core.router.announce)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from fd_core.engine.client import EngineStats
from fd_core.router import announce
from tests.cluster.fake_engine import FakeEngine
from tests.router.fakes import registered, wait_for


def _app(engine: FakeEngine):
    from fd_core.entrypoints.openai.api_server import build_app

    return build_app(engine)


def test_load_reports_the_engines_stats_as_a_mixed_instance():
    engine = FakeEngine()
    engine.stats = lambda: EngineStats(num_running=2, num_waiting=3, num_enqueued=1, num_free_blocks=40,
                                       time=time.time())
    with TestClient(_app(engine)) as client:
        assert client.get("/load").json() == {"role": "mixed", "running": 2, "waiting": 4, "free_blocks": 40,
                                              "total_blocks": 63, "pd_addr": None}


def test_load_before_the_first_stats_counts_every_block_free_and_shows_the_pd_role():
    engine = FakeEngine()
    engine.stats = lambda: EngineStats()
    app = _app(engine)
    app.state.fd.splitwise_role, app.state.fd.pd_addr = "prefill", "127.0.0.1:7001"  # set by disaggregation
    with TestClient(app) as client:
        load = client.get("/load").json()
    assert load["free_blocks"] == load["total_blocks"] == 63
    assert (load["role"], load["pd_addr"]) == ("prefill", "127.0.0.1:7001")


def test_router_flag_values():
    assert announce.router_url("0.0.0.0:30000") == "http://0.0.0.0:30000"
    with pytest.raises(ValueError, match="--router 'nowhere'"):
        announce.router_url("nowhere")
    info = announce.instance_info("http://127.0.0.1:9000", "0.0.0.0", 8180, "decode")
    assert info == {"role": "decode", "host_ip": "127.0.0.1", "port": 8180}  # the address toward the router
    assert announce.instance_info("http://r:1", "10.1.2.3", 8180)["host_ip"] == "10.1.2.3"


def test_an_instance_announces_itself_until_the_router_takes_it(fakes, router, monkeypatch):
    monkeypatch.setattr(announce, "RETRY_SECS", 0.05)
    monkeypatch.setattr(announce, "REFRESH_SECS", 0.05)
    a = fakes("a")
    r = router()
    info = announce.instance_info(r.url, "127.0.0.1", a.server.port)

    async def run() -> None:
        task = asyncio.create_task(announce.announce_forever(r.url, info))
        try:
            await asyncio.to_thread(wait_for, lambda: a.url in registered(r.url), 10, "a registered")
        finally:
            task.cancel()
    asyncio.run(run())
    assert httpx.post(r.url + "/v1/completions", json={"prompt": "p"}, timeout=10).json()["instance"] == "a"
