"""A client that leaves mid-stream aborts its request and frees its KV blocks."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.entrypoints.openai.helpers import GREEDY

pytestmark = pytest.mark.anyio


async def wait_idle(engine_client, timeout=10.0):
    for _ in range(int(timeout / 0.02)):
        st = engine_client.stats()
        if st.num_running == 0 and st.num_waiting == 0 and st.kv_cache_usage == 0:
            return st
        await asyncio.sleep(0.02)
    raise AssertionError(f"engine still busy: {engine_client.stats()}")


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go on forever " * 4}]}),
    ("/v1/completions", {"prompt": ["go on forever " * 4, "and this one too"]}),
])
async def test_disconnect_mid_stream_frees_blocks(live_http, engine_client, path, body, monkeypatch):
    await wait_idle(engine_client)
    engine = engine_client.engine
    aborted_live = []  # request ids aborted while the engine still had them unfinished
    original = engine.abort_request

    def abort_request(request_id):
        if engine.has_unfinished_requests():
            aborted_live.append(request_id)
        original(request_id)

    monkeypatch.setattr(engine, "abort_request", abort_request)
    step = engine.step

    def slow_step():  # 180 steps take >= 0.9 s: the disconnect always lands while they run
        time.sleep(0.005)
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    request = {**body, "max_tokens": 180, "stream": True, **GREEDY}
    seen = 0
    async with live_http.stream("POST", path, json=request) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 4:
                st = engine_client.stats()
                assert st.num_running + st.num_waiting >= 1 and st.kv_cache_usage > 0
                break
    st = await wait_idle(engine_client)
    assert st.kv_cache_usage == 0
    assert len(aborted_live) == len(request.get("prompt", [None]))  # every prompt's request was cut short


async def test_disconnect_before_the_answer_aborts_a_non_streaming_request(app, engine_client, monkeypatch):
    import httpx

    from tests.entrypoints.openai.streaming_transport import StreamingASGITransport

    await wait_idle(engine_client)
    engine = engine_client.engine
    aborted_live = []
    original = engine.abort_request

    def abort_request(request_id):
        if engine.has_unfinished_requests():
            aborted_live.append(request_id)
        original(request_id)

    monkeypatch.setattr(engine, "abort_request", abort_request)
    async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://fd", timeout=60) as client:
        task = asyncio.create_task(client.post("/v1/completions", json={
            "prompt": "a long one", "max_tokens": 200, **GREEDY}))
        for _ in range(500):
            if engine_client.stats().num_running:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_idle(engine_client)
    assert len(aborted_live) == 1
