"""Junk in any request field is a 4xx (or a served answer), never a 500 or a dead engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fd_core.config import EngineArgs
from fd_core.engine.client import InprocEngineClient
from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from fd_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

pytestmark = pytest.mark.anyio

JUNK = [None, "x", -1, 0, 2.5, 10**20, [], [-3], {}, {"a": 1}, True, [[1, 2], "a"]]


@pytest.fixture(scope="module")
def fuzz_app(checkpoint_factory):
    """Its own engine: a request that killed it must not take the other tests down."""
    client = InprocEngineClient(EngineArgs.from_kwargs(
        str(checkpoint_factory("tiny-dense", "pytorch")), backend="cpu", max_model_len=128,
        num_gpu_blocks_override=32, block_size=16))
    yield client, build_app(client, ServerArgs())
    asyncio.run(client.shutdown())


@pytest.mark.parametrize("path,model,base", [
    ("/v1/chat/completions", ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", CompletionRequest, {"prompt": "hi"}),
])
async def test_junk_field_values_never_500(fuzz_app, path, model, base):
    engine_client, app = fuzz_app
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        await _fuzz(http, engine_client, path, model, base)


async def _fuzz(http, engine_client, path, model, base):
    for name in model.model_fields:
        for value in JUNK:
            body = {**base, "max_tokens": 2, name: value}
            if name == "stream" and value is True:
                continue
            r = await asyncio.wait_for(http.post(path, json=body), 30)
            assert r.status_code < 500, (name, value, r.text)
            await engine_client.check_health()
            if r.status_code >= 400:
                assert r.json()["error"]["message"]
    await engine_client.check_health()
    ok = await http.post(path, json={**base, "max_tokens": 1})
    assert ok.status_code == 200
