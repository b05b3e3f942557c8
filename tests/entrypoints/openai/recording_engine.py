"""A scripted engine client that also records the SamplingParams of each request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

from fd_core.engine.outputs import RequestOutput
from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from fd_core.sampling.params import SamplingParams
from tests.entrypoints.openai.fake_engine import ScriptedEngineClient


class RecordingEngineClient(ScriptedEngineClient):
    def __init__(self, tokenizer: Any, pieces: list[str] | None = None) -> None:
        super().__init__(tokenizer, pieces or ["ok"])
        self.params: list[SamplingParams] = []

    async def generate(self, request_id: str, prompt: Any, params: SamplingParams,  # type: ignore[override]
                       arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        self.params.append(params)
        async for out in super().generate(request_id, prompt, params, arrival_time):
            yield out


async def post(client: RecordingEngineClient, path: str, body: dict[str, Any], **server: Any) -> httpx.Response:
    """POST ``body`` to an app over ``client`` built with ``ServerArgs(**server)``."""
    app = build_app(client, ServerArgs(**server))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        return await http.post(path, json=body)
