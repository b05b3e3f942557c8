"""Request bodies: a size limit (413), a time limit (408), and half-read uploads never
count against --max-concurrency."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from fd_core.entrypoints.openai.body_limit import default_max_body_bytes

pytestmark = pytest.mark.anyio
BODY = {"prompt": "hi", "max_tokens": 1, "temperature": 0}


def _scope(path: str = "/v1/completions", length: int | None = None) -> dict:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": headers, "http_version": "1.1", "scheme": "http", "server": ("fd", 80),
            "client": ("c", 1), "root_path": ""}


async def _call(app, scope: dict, messages: list[dict], then_wait: bool = False) -> tuple[int, bytes]:
    """Run one request against the ASGI app; ``then_wait``: after ``messages`` the body
    never completes (a stalled upload)."""
    queue = list(messages)
    status, body = 0, b""

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        if then_wait:
            await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status, body
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            body += message.get("body", b"")

    await app(scope, receive, send)
    return status, body


async def test_a_declared_or_streamed_body_over_the_limit_is_413(engine_client):
    app = build_app(engine_client, ServerArgs(served_model_names=("tiny",), max_request_body_bytes=4096))
    status, body = await _call(app, _scope(length=10_000), [])
    assert status == 413 and "--max-request-body-bytes" in json.loads(body)["error"]["message"]
    chunks = [{"type": "http.request", "body": b"x" * 3000, "more_body": True}] * 2  # no Content-Length
    status, _ = await _call(app, _scope(), chunks)
    assert status == 413
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        assert (await http.post("/v1/completions", json=BODY)).status_code == 200


async def test_a_body_that_stalls_gets_408(engine_client):
    app = build_app(engine_client, ServerArgs(served_model_names=("tiny",), request_body_timeout=0.3))
    part = [{"type": "http.request", "body": b'{"prompt": "h', "more_body": True}]
    status, body = await asyncio.wait_for(_call(app, _scope(), part, then_wait=True), 30)
    assert status == 408 and "did not arrive within 0.3 s" in json.loads(body)["error"]["message"]


async def test_stalled_uploads_do_not_take_the_concurrency_slots(engine_client):
    app = build_app(engine_client, ServerArgs(served_model_names=("tiny",), max_concurrency=2,
                                              request_body_timeout=60))
    part = [{"type": "http.request", "body": b'{"prompt": "h', "more_body": True}]
    stalled = [asyncio.create_task(_call(app, _scope(), part, then_wait=True)) for _ in range(8)]
    await asyncio.sleep(0.2)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
            r = await http.post("/v1/completions", json=BODY)
        assert r.status_code == 200, r.text  # before: 429, every slot held by a half-read upload
    finally:
        for task in stalled:
            task.cancel()
        await asyncio.gather(*stalled, return_exceptions=True)


@pytest.mark.parametrize("max_model_len", [2048, 131072])
def test_the_default_limit_admits_the_longest_prompt_in_either_form(max_model_len):
    ids = json.dumps({"prompt": [103423] * (max_model_len - 1), "max_tokens": 1})
    # a JSON-escaped text prompt: every character \uXXXX, up to 4 characters a token
    text = json.dumps({"messages": [{"role": "user", "content": "\u00e9" * 4 * max_model_len}]})
    assert len(ids) < default_max_body_bytes(max_model_len)
    assert len(text) < default_max_body_bytes(max_model_len)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "word " * 200_000, "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 200_000}], "max_tokens": 1}),
    ("/tokenize", {"prompt": "word " * 200_000}),
])
async def test_text_too_long_for_the_context_is_refused_without_tokenizing_it(engine_client, path, body,
                                                                             monkeypatch):
    app = build_app(engine_client, ServerArgs(served_model_names=("tiny",)))
    calls: list[int] = []
    real = engine_client.tokenizer.encode
    monkeypatch.setattr(engine_client.tokenizer, "encode", lambda text, *a, **k: calls.append(len(text)) or
                        real(text, *a, **k))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        r = await http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert "more than 256 tokens can hold" in r.json()["error"]["message"]  # the fixture's --max-model-len
    assert all(n < 100_000 for n in calls)  # the million characters were never tokenized


async def test_long_text_that_can_fit_is_tokenized_off_the_event_loop(engine_client, monkeypatch):
    import threading

    from fd_core.entrypoints.openai.tokenize_text import INLINE_CHARS, encode_text

    threads: list[str] = []
    real = engine_client.tokenizer.encode
    monkeypatch.setattr(engine_client.tokenizer, "encode", lambda text, *a, **k: threads.append(
        threading.current_thread().name) or real(text, *a, **k))
    await encode_text(engine_client.tokenizer, "a" * (INLINE_CHARS + 1), 1 << 20, "prompt")
    await encode_text(engine_client.tokenizer, "a b", 1 << 20, "prompt")
    assert threads[0] != threading.main_thread().name and threads[1] == threading.main_thread().name
