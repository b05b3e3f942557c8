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
    step = engine.step

    def slow_step():  # 200 steps take >= 1 s: the cancel always lands while they run
        time.sleep(0.005)
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
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



async def test_a_caller_waiting_for_the_engine_goes_before_its_next_step(engine_client, monkeypatch):
    """The engine loop lets a waiting caller (an add, an abort) in before its next
    step: a plain lock is not fair, and the loop retaking it step after step could
    keep an abort waiting until its request had run to the end."""
    import threading

    from fd_core.sampling.params import SamplingParams

    await wait_idle(engine_client)
    engine = engine_client.engine
    events: list[str] = []
    step = engine.step

    def caller():
        with engine_client._engine_turn():
            events.append("caller")

    def recording_step():
        events.append("step")
        if events.count("step") in (3, 6, 9):  # a caller comes while this step holds the engine
            threading.Thread(target=caller).start()
            while not engine_client._callers:
                time.sleep(0.0001)
        return step()

    monkeypatch.setattr(engine, "step", recording_step)
    stream = engine_client.generate("fair", "go on forever", SamplingParams(max_tokens=12, **GREEDY))
    async for _ in stream:
        pass
    await wait_idle(engine_client)
    calls = [k for k, e in enumerate(events) if e == "caller"]
    assert [events[:k].count("step") for k in calls] == [3, 6, 9], events  # each right after its step
