"""Reasoning and tool calls end to end: the real server with ernie_x1 parsers
over a scripted model whose answer contains </think>, <response> and
<tool_call> text."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.entrypoints.test_server_process import Server

scripted = pytest.importorskip("fd_scripted_model", reason="pip install tests/plugins/fd_scripted_model")

REASONING = "Let me think about it.\n</think>\n\n<response>\nThe answer is 42.\n</response>"
TOOL = ('I need the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"location": "北京", "unit": "c"}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "weather of a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}}]


def _serve(tmp_path_factory, script: str) -> Server:
    model = scripted.make_checkpoint(tmp_path_factory.mktemp("scripted") / "model", script)
    srv = Server(["--model", str(model), "--backend", "cpu", "--max-model-len", "512",
                  "--num-gpu-blocks-override", "64", "--block-size", "16", "--served-model-name", "x1",
                  "--reasoning-parser", "ernie-x1", "--tool-call-parser", "ernie_x1"],
                 tmp_path_factory.mktemp("log") / "server.log")
    srv.wait_ready()
    return srv


def _stream(url: str, body: dict) -> tuple[str, str, list, str | None]:
    reasoning, content, calls, finish = "", "", [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                delta = choice["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
                calls += delta.get("tool_calls") or []
                finish = choice.get("finish_reason") or finish
    return reasoning, content, calls, finish


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    srv = _serve(tmp_path_factory, REASONING)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    srv = _serve(tmp_path_factory, TOOL)
    yield srv
    srv.stop()


def test_reasoning_content_and_answer(reasoning_server):
    body = {"model": "x1", "messages": [{"role": "user", "content": "what is the answer?"}], "max_tokens": 200}
    resp = httpx.post(reasoning_server.url + "/v1/chat/completions", json=body, timeout=60).json()
    message = resp["choices"][0]["message"]
    assert message["reasoning_content"] == "Let me think about it."
    assert message["content"] == "The answer is 42."
    assert resp["choices"][0]["finish_reason"] == "stop"
    assert 0 < resp["usage"]["completion_tokens_details"]["reasoning_tokens"] < resp["usage"]["completion_tokens"]
    # streamed deltas reassemble to the non-streamed message
    reasoning, content, calls, finish = _stream(reasoning_server.url, body)
    assert (reasoning, content, calls, finish) == (message["reasoning_content"], message["content"], [], "stop")


def test_tool_calls(tool_server):
    body = {"model": "x1", "messages": [{"role": "user", "content": "weather in Beijing?"}],
            "tools": TOOLS, "max_tokens": 200}
    resp = httpx.post(tool_server.url + "/v1/chat/completions", json=body, timeout=60).json()
    choice = resp["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["reasoning_content"] == "I need the weather."
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"location": "北京", "unit": "c"}
    reasoning, content, calls, finish = _stream(tool_server.url, body)
    assert finish == "tool_calls" and reasoning == "I need the weather."
    assert [c["function"]["name"] for c in calls if c.get("function", {}).get("name")] == ["get_weather"]
    streamed_args = "".join(c.get("function", {}).get("arguments") or "" for c in calls)
    assert json.loads(streamed_args) == {"location": "北京", "unit": "c"}
