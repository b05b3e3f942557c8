"""How the soak talks to the server: good requests through httpx with their
answers checked, and raw HTTP/1.1 for hostile bodies and slow uploads (bytes
httpx would not send: lone surrogates, a Content-Length that lies, a body
that stalls)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from fd_core.testing.soak_requests import Job

__all__ = ["GoodClient", "raw_request", "slow_upload"]

FINISH_REASONS = ("stop", "length")
EXPECT_CONTINUE_BYTES = 64 * 1024


class GoodClient:
    """Runs good requests and reports each one's outcome, or the problem with it."""

    def __init__(self, http: httpx.AsyncClient, url: str, timeout: float,
                 outcome: Callable[[str, str], None], problem: Callable[[str, str], None]) -> None:
        self.http = http
        self.url = url
        self.timeout = timeout
        self.outcome = outcome
        self.problem = problem
        self.greedy: dict[str, str] = {}  # greedy request (less stream) -> its first text

    async def run(self, job: Job) -> None:
        kind = "+".join(job.tags)
        try:
            if job.stream:
                text = await asyncio.wait_for(self._stream(job, kind), self.timeout)
            else:
                text = await asyncio.wait_for(self._plain(job, kind), self.timeout)
        except (httpx.HTTPError, asyncio.TimeoutError, ValueError) as exc:
            self.problem(kind, f"lost: {exc!r} for {_short(job.body)}")
            return
        if text is None:
            return  # a problem or a disconnect, reported
        if job.greedy_key is not None:
            first = self.greedy.setdefault(job.greedy_key, text)
            if first != text:
                self.problem(kind, f"greedy answer changed: {first!r} then {text!r} for {_short(job.body)}")
                return
        self.outcome(kind, "ok")

    async def _plain(self, job: Job, kind: str) -> str | None:
        resp = await self.http.post(self.url + job.path, json=job.body)
        if resp.status_code != 200:
            self.problem(kind, f"HTTP {resp.status_code}: {resp.text[:300]!r} for {_short(job.body)}")
            return None
        body = resp.json()
        choices = body.get("choices") or []
        why = _check_choices(job, choices)
        if why:
            self.problem(kind, f"{why} for {_short(job.body)}")
            return None
        return _text_of(choices[0]) if len(choices) == 1 else None

    async def _stream(self, job: Job, kind: str) -> str | None:
        finish: dict[int, str | None] = {}
        texts: dict[int, str] = {}
        events = 0
        done = False
        async with self.http.stream("POST", self.url + job.path, json=job.body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                self.problem(kind, f"HTTP {resp.status_code}: {resp.text[:300]!r} for {_short(job.body)}")
                return None
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    self.problem(kind, f"error event {chunk['error']} for {_short(job.body)}")
                    return None
                events += 1
                for c in chunk.get("choices", []):
                    i = c["index"]
                    texts[i] = texts.get(i, "") + _text_of(c)
                    if c.get("finish_reason"):
                        finish[i] = c["finish_reason"]
                if job.disconnect_after is not None and events >= job.disconnect_after and not finish:
                    self.outcome(kind, "disconnected")  # leaving the block closes the connection
                    return None
        if not done:
            self.problem(kind, f"the stream ended without [DONE] for {_short(job.body)}")
            return None
        missing = [i for i in range(job.choices) if finish.get(i) not in FINISH_REASONS]
        if missing:
            self.problem(kind, f"choices {missing} without a finish_reason ({finish}) for {_short(job.body)}")
            return None
        return texts.get(0, "") if job.choices == 1 else None


def _text_of(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    part = choice.get("delta") or choice.get("message") or {}
    return part.get("content") or ""


def _check_choices(job: Job, choices: list[dict[str, Any]]) -> str | None:
    """What is wrong with a non-streamed answer's choices (None: nothing)."""
    if sorted(c.get("index", -1) for c in choices) != list(range(job.choices)):
        return f"{len(choices)} choices, {job.choices} due"
    for c in choices:
        if c.get("finish_reason") not in FINISH_REASONS:
            return f"choice {c.get('index')} finish_reason {c.get('finish_reason')!r}"
        if job.logprobs and not c.get("logprobs"):
            return f"choice {c.get('index')} without logprobs"
        if job.prompt_logprobs:
            ids = c.get("prompt_token_ids") or (c.get("message") or {}).get("prompt_token_ids")
            entries = c.get("prompt_logprobs")
            if not ids or not entries or len(entries) != len(ids) or any(e is None for e in entries[1:]):
                got = "none" if not entries else f"{len(entries)} ({sum(e is None for e in entries)} null)"
                return (f"choice {c.get('index')}: prompt_logprobs for {len(ids or [])} prompt tokens "
                        f"has {got} entries")
    return None


def _short(body: dict[str, Any]) -> str:
    return json.dumps(body)[:240]


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    return await asyncio.open_connection(parts.hostname, parts.port or 80)


def _head(url: str, path: str, length: int, headers: dict[str, str]) -> bytes:
    host = urlsplit(url).netloc
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
             f"Content-Length: {headers.get('Content-Length', length)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k != "Content-Length"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status_of(head: bytes) -> int:
    parts = head.split(b"\r\n", 1)[0].split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0


async def _answer(reader: asyncio.StreamReader) -> tuple[int, str]:
    """Status (0: none) and body of the rest of a Connection: close exchange."""
    data = await reader.read()
    head, _, body = data.partition(b"\r\n\r\n")
    return _status_of(head), body.decode(errors="replace")


async def raw_request(url: str, path: str, body: bytes, headers: dict[str, str],
                      timeout: float) -> tuple[int, str]:
    """POST ``body`` as is; returns (status, answer body). A ``Content-Length`` in
    ``headers`` is a lie: only the headers are sent (the server must refuse by the
    declared size, not wait for the body). A large body waits for the
    server's ``100 Continue`` (a server that refuses it by its size answers 413 at
    once, and a body sent anyway could reset the connection before that answer is read)."""
    reader, writer = await _open(url)
    try:
        if len(body) > EXPECT_CONTINUE_BYTES:
            headers = {**headers, "Expect": "100-continue"}
        writer.write(_head(url, path, len(body), headers))
        await writer.drain()
        if "Content-Length" in headers:  # a declared size the body does not have: headers only
            return await asyncio.wait_for(_answer(reader), timeout)
        if "Expect" in headers:
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            if _status_of(first) != 100:  # refused without reading the body
                rest = await asyncio.wait_for(reader.read(), timeout)
                return _status_of(first), rest.decode(errors="replace")
        try:
            writer.write(body)
            await writer.drain()
        except ConnectionError:
            pass
        status, text = await asyncio.wait_for(_answer(reader), timeout)
        if not status:
            raise ConnectionError("no HTTP answer")
        return status, text
    finally:
        writer.close()


async def slow_upload(url: str, model: str, mode: str, rng: random.Random, body_timeout: float) -> str:
    """One slow upload; returns its outcome, ``problem: ...`` when the server got it wrong.

    ``close``: part of the body, a stall, then the client goes (we caused it);
    ``timeout``: part of the body, then wait: the server must answer 408 in time;
    ``trickle``: the whole body in small pieces over a few seconds: a normal 200.
    """
    body = json.dumps({"model": model, "prompt": "slow upload " * rng.randint(5, 50), "max_tokens": 4}).encode()
    reader, writer = await _open(url)
    try:
        writer.write(_head(url, "/v1/completions", len(body), {}))
        if mode == "trickle":
            pieces = [body[i:i + 16] for i in range(0, len(body), 16)]
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(min(0.2, 3.0 / len(pieces)))
            status, text = await asyncio.wait_for(_answer(reader), 120)
            if status != 200 or '"finish_reason"' not in text:
                return f"problem: a slow but complete upload got HTTP {status}: {text[:200]!r}"
            return "ok"
        writer.write(body[:rng.randint(1, len(body) - 1)])
        await writer.drain()
        if mode == "close":
            await asyncio.sleep(rng.uniform(0.1, 5.0))
            return "abandoned"
        status, text = await asyncio.wait_for(_answer(reader), body_timeout + 15)
        if status != 408:
            return f"problem: a stalled upload got HTTP {status} (408 due): {text[:200]!r}"
        return "408"
    except (OSError, asyncio.TimeoutError) as exc:
        return f"problem: {mode} upload: {exc!r}"
    finally:
        writer.close()
