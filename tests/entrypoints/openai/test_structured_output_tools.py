"""Forced tool calls (tool_choice "required" / named) streamed in pieces, and
parallel_tool_calls false, through the chat endpoint on scripted model text
(the text is what a constrained model would write; the constraint itself is
tested on the real engine in test_structured_output.py)."""

from __future__ import annotations

import json

import httpx
import pytest

from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from fd_core.entrypoints.openai.guided_request import ForcedToolStream
from fd_core.tokenizer import Tokenizer
from tests.entrypoints.openai.fake_engine import ScriptedEngineClient
from tests.entrypoints.openai.helpers import sse_events

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "weather?"}]
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ARGS = ['{"ci', 'ty": "Par', 'is, {FR}",', ' "days": 3', '}']
REQUIRED = ['[{"name": "get_', 'weather", "param', 'eters": {"city": "Rome"}}, ', '{"name": "get_time", ',
            '"parameters": {}}]']
THINK = ["<think>", "\nThe user", " wants weather", ".\n", "</think>", "\n\n"]
CALL = ["<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "\n", "</tool_call>"]
CALL2 = ["\n<tool_call>", '\n{"name": "get_time", "arguments": {}}', "\n</tool_call>"]


@pytest.fixture(scope="module")
def tokenizer(checkpoint_factory):
    return Tokenizer.from_pretrained(checkpoint_factory("tiny-dense", "pytorch"))


async def post(tokenizer, pieces, body, finish_reason="stop", **server):
    app = build_app(ScriptedEngineClient(tokenizer, pieces, finish_reason), ServerArgs(**server))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        r = await http.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS, **body})
    assert r.status_code == 200, r.text
    return r


def joined_calls(events):
    """{index: (id, name, arguments joined)} and the finish reason of a streamed answer."""
    calls, finish, content = {}, None, ""
    for e in events:
        if e == "[DONE]" or not e.get("choices"):
            continue
        choice = e["choices"][0]
        finish = choice.get("finish_reason") or finish
        content += choice["delta"].get("content") or ""
        for piece in choice["delta"].get("tool_calls") or []:
            call = calls.setdefault(piece["index"], [None, None, ""])
            if "id" in piece:
                assert call[0] is None, "a call's header is sent once"
                call[0], call[1] = piece["id"], piece["function"]["name"]
            call[2] += piece.get("function", {}).get("arguments", "")
    return calls, finish, content


async def test_named_tool_choice_streams_the_arguments_in_pieces(tokenizer):
    events = sse_events((await post(tokenizer, ARGS, {"tool_choice": NAMED, "stream": True})).text)
    arg_chunks = [e for e in events if e != "[DONE]" and e["choices"]
                  and e["choices"][0]["delta"].get("tool_calls")]
    assert len(arg_chunks) >= 3  # pieces as they come, not one delta at the end
    calls, finish, content = joined_calls(events)
    assert finish == "tool_calls" and content == ""
    assert calls[0][1] == "get_weather" and json.loads(calls[0][2]) == {"city": "Paris, {FR}", "days": 3}
    whole = (await post(tokenizer, ARGS, {"tool_choice": NAMED})).json()["choices"][0]
    assert json.loads(whole["message"]["tool_calls"][0]["function"]["arguments"]) == json.loads(calls[0][2])


async def test_required_tool_choice_streams_each_call(tokenizer):
    events = sse_events((await post(tokenizer, REQUIRED, {"tool_choice": "required", "stream": True})).text)
    calls, finish, _ = joined_calls(events)
    assert finish == "tool_calls"
    assert [(c[1], json.loads(c[2])) for _, c in sorted(calls.items())] == [
        ("get_weather", {"city": "Rome"}), ("get_time", {})]


async def test_forced_call_after_reasoning_streams_reasoning_then_the_call(tokenizer):
    events = sse_events((await post(tokenizer, THINK + ARGS, {"tool_choice": NAMED, "stream": True},
                                    reasoning_parser="ernie_x1")).text)
    reasoning = "".join(e["choices"][0]["delta"].get("reasoning_content") or "" for e in events
                        if e != "[DONE]" and e["choices"])
    calls, finish, _ = joined_calls(events)
    assert reasoning == "The user wants weather." and finish == "tool_calls"
    assert json.loads(calls[0][2])["city"] == "Paris, {FR}"


async def test_a_forced_call_cut_off_by_max_tokens_is_not_finished_as_a_call(tokenizer):
    events = sse_events((await post(tokenizer, ARGS[:2], {"tool_choice": NAMED, "stream": True},
                                    finish_reason="length")).text)
    calls, finish, _ = joined_calls(events)
    assert finish == "length" and calls[0][2] == '{"city": "Par'  # as generated, as vLLM streams it
    whole = (await post(tokenizer, ARGS[:2], {"tool_choice": NAMED}, finish_reason="length")).json()["choices"][0]
    assert whole["finish_reason"] == "length" and whole["message"]["content"] == '{"city": "Par'


def test_required_with_parallel_tool_calls_false_allows_exactly_one_call():
    from fd_core.entrypoints.openai.guided_request import guided_params
    from fd_core.entrypoints.openai.protocol import ChatCompletionRequest

    req = ChatCompletionRequest(messages=USER, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    schema = guided_params(req, reasoning=False).json
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    req = ChatCompletionRequest(messages=USER, tools=TOOLS, tool_choice="required")
    assert "maxItems" not in guided_params(req, reasoning=False).json


@pytest.mark.parametrize("stream", [False, True])
async def test_auto_with_parallel_tool_calls_false_keeps_the_first_call(tokenizer, stream):
    body = {"tool_choice": "auto", "parallel_tool_calls": False, "stream": stream}
    r = await post(tokenizer, THINK + CALL + CALL2, body, reasoning_parser="ernie_x1", tool_call_parser="ernie_x1")
    if stream:
        calls, finish, _ = joined_calls(sse_events(r.text))
        names = [c[1] for _, c in sorted(calls.items())]
    else:
        choice = r.json()["choices"][0]
        finish, names = choice["finish_reason"], [c["function"]["name"] for c in choice["message"]["tool_calls"]]
    assert finish == "tool_calls" and names == ["get_weather"]
    body["parallel_tool_calls"] = True  # both calls when it is left on
    r = await post(tokenizer, THINK + CALL + CALL2, body, reasoning_parser="ernie_x1", tool_call_parser="ernie_x1")
    n = len(joined_calls(sse_events(r.text))[0]) if stream else len(r.json()["choices"][0]["message"]["tool_calls"])
    assert n == 2


def test_forced_stream_scanner_is_indifferent_to_how_the_text_is_cut():
    from types import SimpleNamespace

    text = '[ {"name": "a", "parameters": {"s": "x,}\\"]{", "n": [1, {"name": 2}]}} ,\n{"name":"b","parameters":{}}]'
    for size in (1, 2, 5, len(text)):
        stream, got = ForcedToolStream(SimpleNamespace(tool_choice="required")), {}
        for i in range(0, len(text), size):
            for piece in stream.feed(text[i:i + size]):
                call = got.setdefault(piece["index"], ["", ""])
                call[0] += piece.get("function", {}).get("name", "")
                call[1] += piece.get("function", {}).get("arguments", "")
        assert {k: (n, json.loads(a)) for k, (n, a) in got.items()} == {
            0: ("a", {"s": 'x,}"]{', "n": [1, {"name": 2}]}), 1: ("b", {})}, size
