"""Fake fd-serve instances (tiny FastAPI apps) and a uvicorn-in-a-thread runner, for the router tests.

A ``FakeInstance`` answers /health, /load, /v1/models and both generation
routes; what it does is set on the object while it runs: ``health_status``,
``status`` (an answer such as 503 before any byte), ``die_after`` (close the
stream after that many chunks), ``gate`` (an event the stream waits on after
its first chunk), ``delay`` (seconds per chunk), and the load it reports.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """``app`` served by uvicorn on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            assert self.thread.is_alive(), "server thread died"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class FakeInstance:
    def __init__(self, name: str, role: str = "mixed", pd_addr: str | None = None, chunks: int = 3) -> None:
        self.name, self.role, self.pd_addr, self.chunks = name, role, pd_addr, chunks
        self.health_status = 200
        self.status = 200
        self.die_after: int | None = None
        self.gate: threading.Event | None = None
        self.headers_gate: threading.Event | None = None  # held before answering anything
        self.delay = 0.0
        self.running = self.waiting = 0
        self.received: list[dict[str, Any]] = []  # {"path", "body", "headers"} per generation request
        self.active = 0
        self.server = ServerThread(self._app())
        self.url = self.server.url

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=self.health_status)

        @app.get("/load")
        async def load() -> dict[str, Any]:
            return {"role": self.role, "running": self.running, "waiting": self.waiting, "free_blocks": 10,
                    "total_blocks": 16, "pd_addr": self.pd_addr}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": self.name}]}

        async def generate(request: Request) -> Response:
            body = await request.json()
            self.received.append({"path": request.url.path, "body": body, "headers": dict(request.headers)})
            while self.headers_gate is not None and not self.headers_gate.is_set():
                await asyncio.sleep(0.01)
            if self.status != 200:
                return JSONResponse({"error": {"message": f"{self.name} refuses", "code": self.status}},
                                    status_code=self.status)
            if not body.get("stream"):
                self.active += 1
                try:
                    await asyncio.sleep(self.delay * self.chunks)
                finally:
                    self.active -= 1
                return JSONResponse({"instance": self.name, "choices": [{"text": "x" * self.chunks}]},
                                    headers={"x-request-id": "req-1"})
            return StreamingResponse(self._events(), media_type="text/event-stream")

        for path in ("/v1/chat/completions", "/v1/completions"):
            app.add_api_route(path, generate, methods=["POST"])
        return app

    async def _events(self) -> AsyncIterator[bytes]:
        self.active += 1
        try:
            for i in range(self.chunks):
                if self.die_after is not None and i == self.die_after:
                    raise RuntimeError("instance died mid-stream")
                yield f"data: {json.dumps({'instance': self.name, 'i': i})}\n\n".encode()
                if i == 0 and self.gate is not None:
                    while not self.gate.is_set():
                        await asyncio.sleep(0.01)
                await asyncio.sleep(self.delay)
            yield b"data: [DONE]\n\n"
        finally:
            self.active -= 1

    def stop(self) -> None:
        self.server.stop()


def wait_for(predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def registered(router_url: str) -> dict[str, dict[str, Any]]:
    data = httpx.get(router_url + "/registered", timeout=5).json()
    return {i["url"]: i for i in data["instances"]}
