"""Reasoning and tool-call parsing through the chat endpoint, on scripted model text."""

from __future__ import annotations

import json

import httpx
import pytest

from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from fd_core.tokenizer import Tokenizer
from tests.entrypoints.openai.fake_engine import ScriptedEngineClient
from tests.entrypoints.openai.helpers import sse_events

pytest.importorskip("fd_core.parsers")
pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
THINK = ["<think>", "\nThe user", " wants weather", ".\n", "</think>", "\n\n"]
CALL = ["<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "\n", "</tool_call>"]
ANSWER = ["<response>", "\nIt is", " sunny.", "\n", "</response>"]


@pytest.fixture(scope="module")
def tokenizer(checkpoint_factory):
    return Tokenizer.from_pretrained(checkpoint_factory("tiny-dense", "pytorch"))


async def post(tokenizer, pieces, body, **server):
    client = ScriptedEngineClient(tokenizer, pieces)
    app = build_app(client, ServerArgs(reasoning_parser="ernie_x1", tool_call_parser="ernie-x1", **server))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        r = await http.post("/v1/chat/completions", json={"messages": USER, **body})
    assert r.status_code == 200, r.text
    return r


def reasoning_token_count(tokenizer, pieces):
    ids = [t for p in pieces for t in tokenizer.encode(p)]
    return ids.index(tokenizer.added_tokens["</think>"]) + 1


async def test_reasoning_and_answer(tokenizer):
    body = (await post(tokenizer, THINK + ANSWER, {})).json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "The user wants weather."
    assert message["content"] == "It is sunny."
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == reasoning_token_count(tokenizer, THINK)

    events = sse_events((await post(tokenizer, THINK + ANSWER, {"stream": True, "stream_options": {
        "include_usage": True}})).text)
    deltas = [e["choices"][0]["delta"] for e in events[:-2]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user wants weather."
    assert "".join(d.get("content", "") for d in deltas) == "It is sunny."
    assert events[-2]["usage"]["completion_tokens_details"]["reasoning_tokens"] \
        == reasoning_token_count(tokenizer, THINK)


async def test_tool_calls(tokenizer):
    body = (await post(tokenizer, THINK + CALL, {"tools": TOOLS})).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert not choice["message"]["content"]

    events = sse_events((await post(tokenizer, THINK + CALL, {"tools": TOOLS, "stream": True})).text)
    calls = [tc for e in events[:-1] for tc in e["choices"][0]["delta"].get("tool_calls", [])]
    assert calls and calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls)) == {"city": "Paris"}
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_no_tools_in_the_request_means_no_tool_parsing(tokenizer):
    body = (await post(tokenizer, THINK + CALL, {})).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert "<tool_call>" in choice["message"]["content"]


async def test_thinking_disabled_makes_everything_content(tokenizer):
    body = (await post(tokenizer, ["It is", " sunny."], {"chat_template_kwargs": {"enable_thinking": False}})).json()
    message = body["choices"][0]["message"]
    assert message["content"] == "It is sunny." and "reasoning_content" not in message
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


async def test_unknown_parser_name_fails_at_build_time(tokenizer):
    with pytest.raises(ValueError, match="no_such_parser"):
        build_app(ScriptedEngineClient(tokenizer, ["x"]), ServerArgs(reasoning_parser="no_such_parser"))


UNCLOSED = ["<tool_call>", "\nI should call", " get_weather for Paris", " but first I will explain", " <"]


@pytest.mark.parametrize("pieces", [THINK + UNCLOSED, THINK + CALL[:3], THINK + ["<response>", "\nok <tool"]])
async def test_streamed_deltas_join_to_the_one_shot_message(tokenizer, pieces):
    body = (await post(tokenizer, pieces, {"tools": TOOLS})).json()
    message, finish = body["choices"][0]["message"], body["choices"][0]["finish_reason"]
    events = sse_events((await post(tokenizer, pieces, {"tools": TOOLS, "stream": True})).text)
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e.get("choices")]
    assert "".join(d.get("content") or "" for d in deltas) == (message["content"] or "")
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == message["reasoning_content"]
    streamed = [(c["function"]["name"], c["function"]["arguments"]) for d in deltas for c in d.get("tool_calls", [])]
    assert streamed == [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    assert events[-2]["choices"][0]["finish_reason"] == finish
    if pieces[-1] == " <":
        assert message["content"] == "".join(UNCLOSED) and finish == "stop"  # issue 14: it vanished when streamed
