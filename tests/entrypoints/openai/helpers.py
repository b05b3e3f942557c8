"""Small helpers shared by the OpenAI server tests."""

from __future__ import annotations

import json
from typing import Any

import httpx

GREEDY = {"temperature": 0, "ignore_eos": True}


def sse_events(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body (JSON decoded; ``[DONE]`` kept as a str)."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def assert_error(response: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    """``response`` is an OpenAI-style error with ``status`` whose message names ``words``."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and isinstance(error["type"], str) and error["type"]
    for word in words:
        assert word in error["message"], (word, error["message"])
    return error
