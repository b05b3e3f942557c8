"""--max-waiting-time: a request not served within that many seconds is aborted with 408."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from tests.entrypoints.openai.fake_engine import ScriptedEngineClient

pytestmark = pytest.mark.anyio


class SlowEngine(ScriptedEngineClient):
    """Holds every request ``delay`` seconds before its first output; records closes."""

    def __init__(self, tokenizer: Any, delay: float) -> None:
        super().__init__(tokenizer, ["hello"])
        self.delay = delay
        self.closed = 0

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        try:
            await asyncio.sleep(self.delay)
            async for out in super().generate(*args, **kwargs):
                yield out
        finally:
            self.closed += 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_waiting_longer_than_max_waiting_time_gets_408(engine_client, stream):
    engine = SlowEngine(engine_client.tokenizer, delay=5.0)
    app = build_app(engine, ServerArgs(served_model_names=("tiny",), max_waiting_time=0.2))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        r = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream})
    assert r.status_code == 408
    assert "--max-waiting-time" in r.json()["error"]["message"]
    assert engine.closed == 1  # the engine request was aborted, not left running


async def test_a_request_served_in_time_is_not_affected(engine_client):
    engine = SlowEngine(engine_client.tokenizer, delay=0.0)
    app = build_app(engine, ServerArgs(served_model_names=("tiny",), max_waiting_time=30))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        r = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "hello"


class BarrierEngine(ScriptedEngineClient):
    """Answers no request until ``count`` requests are in: a batch the API layer
    submitted one after another would never be served."""

    def __init__(self, tokenizer: Any, count: int) -> None:
        super().__init__(tokenizer, ["hello"])
        self.count = count
        self.submitted = 0
        self.all_in = asyncio.Event()

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.submitted += 1
        if self.submitted >= self.count:
            self.all_in.set()
        await self.all_in.wait()
        async for out in super().generate(*args, **kwargs):
            yield out


async def test_the_prompts_of_one_completion_request_are_submitted_together(engine_client):
    engine = BarrierEngine(engine_client.tokenizer, count=3)
    app = build_app(engine, ServerArgs(served_model_names=("tiny",), max_waiting_time=5))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        r = await http.post("/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2]
