"""A tiny OpenAI-compatible streaming server on a real socket, for fd-bench serve tests.

Each request streams ``max_tokens`` tokens: one in the first chunk, then two per
chunk, with usage on every chunk when ``continuous_usage_stats`` is asked for
and a final usage chunk when ``include_usage`` is. Every ``fail_every``-th
request (counted from 1) gets a 500. ``delay`` is the pause before each chunk
(a slower or faster "model"); ``accept_token_ids=False`` answers a token-id
prompt with a 400, as a server without that feature would. ``app.state.spans``
holds each request's (start, end) on ``time.monotonic``. ``usage_on_finish``
answers as llama-server does: no usage per chunk, then a finish chunk with an
empty text, ``finish_reason`` and the total usage.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def _chunk(body: dict[str, Any], chat: bool, text: str, usage: dict | None) -> str:
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    obj: dict[str, Any] = {"id": "x", "object": "chunk", "choices": [choice]}
    if usage is not None:
        obj["usage"] = usage
    return f"data: {json.dumps(obj)}\n\n"


def make_app(fail_every: int = 0, send_usage: bool = True, delay: float = 0.002,
             accept_token_ids: bool = True, usage_on_finish: bool = False) -> FastAPI:
    app = FastAPI()
    app.state.bodies = []
    app.state.headers = []
    app.state.spans = []

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    async def generate(request: Request, chat: bool):
        started = time.monotonic()
        body = await request.json()
        app.state.bodies.append(body)
        app.state.headers.append(dict(request.headers))
        if fail_every and len(app.state.bodies) % fail_every == 0:
            return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        if isinstance(prompt, list) and not accept_token_ids:
            return JSONResponse({"error": {"message": "prompt must be a string"}}, status_code=400)
        n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        n_out = int(body["max_tokens"])
        opts = body.get("stream_options") or {}

        async def stream():
            if chat:  # a role-only first chunk, as OpenAI sends
                yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
            sent = 0
            while sent < n_out:
                await asyncio.sleep(delay)
                k = 1 if sent == 0 else min(2, n_out - sent)
                sent += k
                usage = ({"prompt_tokens": n_prompt, "completion_tokens": sent}
                         if send_usage and opts.get("continuous_usage_stats") and not usage_on_finish else None)
                yield _chunk(body, chat, " tok" * k, usage)
            if usage_on_finish:
                usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': '', 'finish_reason': 'length'}], 'usage': usage})}\n\n"
            elif send_usage and opts.get("include_usage"):
                usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                         "total_tokens": n_prompt + n_out}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
            app.state.spans.append((started, time.monotonic()))

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    return app


class ServerThread:
    """Runs ``app`` with uvicorn on 127.0.0.1 and a free port, in a daemon thread."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
