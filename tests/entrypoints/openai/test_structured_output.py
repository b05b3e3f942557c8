"""Structured output over the OpenAI API on the random-weight tiny checkpoint:
response_format, guided_* on both endpoints, streaming and not, tool_choice."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.entrypoints.openai.helpers import assert_error

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "JSON please"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["city", "n"], "additionalProperties": False}
COMPACT = {"guided_whitespace_pattern": ""}


async def test_response_format_json_schema_validates(http):
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}
    r = await http.post(CHAT, json={"messages": USER, "response_format": fmt, "max_tokens": 120, "seed": 1,
                                    "n": 3, **COMPACT})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


async def test_streamed_json_object_parses(http):
    r = await http.post(CHAT, json={"messages": USER, "response_format": {"type": "json_object"}, "stream": True,
                                    "max_tokens": 200, "seed": 3, **COMPACT})
    assert r.status_code == 200, r.text
    text, finish = "", None
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                text += c["delta"].get("content") or ""
                finish = c.get("finish_reason") or finish
    if finish == "stop":
        assert isinstance(json.loads(text), dict)


async def test_completions_guided_regex_and_choice(http):
    r = await http.post(COMPLETIONS, json={"prompt": "id:", "guided_regex": "[a-z]{2}[0-9]{2}", "max_tokens": 20})
    assert re.fullmatch("[a-z]{2}[0-9]{2}", r.json()["choices"][0]["text"]), r.text
    r = await http.post(COMPLETIONS, json={"prompt": "?", "guided_choice": ["left", "right"], "max_tokens": 20})
    assert r.json()["choices"][0]["text"] in ("left", "right"), r.text


async def test_named_tool_choice_returns_a_tool_call_with_valid_arguments(http):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}]  # the template lists them: a 200-token prompt
    r = await http.post(CHAT, json={"messages": USER, "tools": tools, "max_tokens": 40, "seed": 2,
                                    "tool_choice": {"type": "function", "function": {"name": "weather"}}, **COMPACT})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", r.text  # this seed completes within 40 tokens
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "weather"
    jsonschema.validate(json.loads(call["arguments"]), SCHEMA)


@pytest.mark.parametrize("body, words", [
    ({"guided_json": {"type": "object", "properties": {"a": {"not": {}}}}}, ["not"]),
    ({"guided_regex": "(a"}, ["regex"]),
    ({"guided_grammar": "root ::= ( \"a\""}, ["grammar", "Expected"]),
    ({"guided_json": {"type": "object"}, "guided_regex": "a"}, ["guided_json and guided_regex"]),
])
async def test_bad_constraints_are_a_400_naming_the_problem(http, body, words):
    r = await http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 5, **body})
    assert_error(r, 400, *words)


async def test_streamed_forced_tool_calls_validate_and_match_the_whole_answer(http):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}]
    body = {"messages": USER, "tools": tools, "max_tokens": 40, "seed": 2, "tool_choice": "required",
            "parallel_tool_calls": False, **COMPACT}
    whole = (await http.post(CHAT, json=body)).json()["choices"][0]
    r = await http.post(CHAT, json={**body, "stream": True})
    pieces, finish = [], None
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                pieces += c["delta"].get("tool_calls") or []
                finish = c.get("finish_reason") or finish
    assert finish == whole["finish_reason"] == "tool_calls"  # this seed completes within 40 tokens
    (call,) = whole["message"]["tool_calls"]  # parallel_tool_calls false: exactly one
    assert {p["index"] for p in pieces} == {0} and pieces[0]["function"]["name"] == "weather"
    assert len(pieces) > 2  # the arguments in pieces
    args = "".join(p["function"].get("arguments", "") for p in pieces)
    assert json.loads(args) == json.loads(call["function"]["arguments"])
    jsonschema.validate(json.loads(args), SCHEMA)
