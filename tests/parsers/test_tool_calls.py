"""The ernie_x1 tool-call parser: crafted outputs, malformed ones, and streaming."""

from __future__ import annotations

import json
import random

import pytest

from fd_core.parsers import ToolParserManager
from tests.parsers.conftest import splits


def call(name: str, args: object, raw: str | None = None) -> str:
    body = raw if raw is not None else json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


WEATHER = call("get_weather", {"location": "北京"})


def extract(text: str):
    return ToolParserManager.get("ernie_x1")(None).extract_tool_calls(text)


def calls_of(result) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in result.tool_calls]


def test_one_call_with_unicode_arguments():
    result = extract(WEATHER)
    assert result.tools_called and result.content is None
    assert calls_of(result) == [("get_weather", '{"location": "北京"}')]
    (tool_call,) = result.tool_calls
    assert tool_call.type == "function" and tool_call.id.startswith("call_")
    assert extract("x").tool_calls == [] and extract("x").content == "x"


def test_several_calls_and_content_around_them():
    text = "Let me check both.\n" + WEATHER + "\n" + call("get_time", {"tz": "Asia/Shanghai"}) + "\nDone."
    result = extract(text)
    assert calls_of(result) == [("get_weather", '{"location": "北京"}'),
                                ("get_time", '{"tz": "Asia/Shanghai"}')]
    assert result.content == "Let me check both.\n\n\nDone."
    ids = [c.id for c in result.tool_calls]
    assert len(set(ids)) == 2 and ids != [c.id for c in extract(text).tool_calls]  # random ids


def test_arguments_are_normalised_json():
    compact = call("f", None, raw='{"name":"f","arguments":{"a":1,"b":[true,null],"c":"\\u5317"}}')
    as_string = call("f", None, raw='{"name": "f", "arguments": "{\\"a\\": 1}"}')
    missing = call("f", None, raw='{"name": "f"}')
    assert calls_of(extract(compact)) == [("f", '{"a": 1, "b": [true, null], "c": "北"}')]
    assert calls_of(extract(as_string)) == [("f", '{"a": 1}')]
    assert calls_of(extract(missing)) == [("f", "{}")]


@pytest.mark.parametrize("bad", [
    call("f", None, raw='{"name": "f", "arguments": {"a": 1,}}'),  # invalid JSON
    call("f", None, raw='{"arguments": {"a": 1}}'),  # no name
    call("f", None, raw='["f", {}]'),  # not an object
    call("f", None, raw="get_weather(location='Beijing')"),
])
def test_a_closed_block_that_is_not_a_call_stays_content(bad):
    result = extract("before " + bad + " after")
    assert not result.tools_called and result.tool_calls == []
    assert result.content == "before " + bad + " after"
    mixed = extract(bad + WEATHER)
    assert calls_of(mixed) == [("get_weather", '{"location": "北京"}')] and mixed.content == bad


def test_truncated_output():
    # cut inside the JSON (max_tokens): no call, and the half call stays content, as written
    cut = "I will look.\n" + WEATHER[: WEATHER.index("北") + 1]
    result = extract(cut)
    assert not result.tools_called and result.content == cut
    # a <tool_call> followed by prose that never closes: content too
    prose = "<tool_call>\nI will call get_weather for you"
    assert extract(prose).content == prose and not extract(prose).tools_called
    # the JSON is complete, only </tool_call> is missing: the call stands
    no_end = extract(WEATHER[: -len("\n</tool_call>")])
    assert calls_of(no_end) == [("get_weather", '{"location": "北京"}')]
    # a complete call followed by a cut one
    both = extract(WEATHER + "\n<tool_call>\n{\"name\": \"get_ti")
    assert calls_of(both) == [("get_weather", '{"location": "北京"}')]
    assert both.content == "\n<tool_call>\n{\"name\": \"get_ti"
    # a piece of a tag at the end is text
    assert extract("x <tool_ca").content == "x <tool_ca"
    assert extract(WEATHER[:-3]).content is None  # a piece of </tool_call> after a call is the call's


def test_whitespace_only_content_is_none_beside_calls():
    assert extract("\n\n" + WEATHER + "\n \n" + WEATHER + "\n").content is None
    assert extract("\n \n").content == "\n \n" and not extract("\n").tools_called  # no calls: unchanged


def stream_tool_calls(deltas: list[str]):
    parser = ToolParserManager.get("ernie-x1")(None)
    previous, content, calls, messages = "", "", {}, []
    for delta in deltas:
        msg = parser.extract_tool_calls_streaming(previous, previous + delta, delta, [], [], [])
        previous += delta
        if msg is None:
            continue
        assert msg.content or msg.tool_calls
        messages.append(msg)
    last = parser.finish_streaming()
    assert last is None or (last.content and not last.tool_calls)
    for msg in [*messages, *([last] if last else [])]:
        content += msg.content or ""
        for d in msg.tool_calls:
            entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id is not None:
                assert entry["id"] is None and d.type == "function"
                entry["id"] = d.id
            if d.function is not None:
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
    assert sorted(calls) == list(range(len(calls)))
    assert all(entry["id"] for entry in calls.values())
    return content, [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]


TOOL_TEXTS = [
    WEATHER,
    "Checking.\n" + WEATHER + "\n" + call("get_time", {"tz": "UTC", "q": "a}b{\"c"}) + "\nok",
    call("f", None, raw='{"name":"f","arguments":{"nested":{"x":[1,2,{"y":"}"}]}}}') + " tail <tool",
    "a " + call("f", None, raw='{"name": "f", "arguments": {"a": 1,}}') + " b " + WEATHER,
    "\n\n" + WEATHER + "\n\n",
    WEATHER[:-5],
    WEATHER + "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"k\": \"v",
    "no calls here, only < and > and {braces}",
]


@pytest.mark.parametrize("index", range(len(TOOL_TEXTS)))
def test_streaming_equals_one_shot_for_any_split(index):
    text = TOOL_TEXTS[index]
    result = extract(text)
    want = (result.content or "", calls_of(result))
    for deltas in splits(text, seed=index):
        assert stream_tool_calls(deltas) == want, deltas


def test_streaming_every_prefix_agrees():
    text = TOOL_TEXTS[1]
    rng = random.Random(3)
    for end in range(len(text) + 1):
        prefix = text[:end]
        deltas, i = [], 0
        while i < end:
            n = rng.randint(1, 6)
            deltas.append(prefix[i : i + n])
            i += n
        result = extract(prefix)
        assert stream_tool_calls(deltas) == (result.content or "", calls_of(result)), prefix


def test_streaming_sends_a_call_when_its_json_closes():
    parser = ToolParserManager.get("ernie_x1")(None)
    deltas = ["Sure.", "\n<tool_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"location\": \"北",
              "京\"}}", "\n</tool_call>"]
    previous, messages = "", []
    for delta in deltas:
        messages.append(parser.extract_tool_calls_streaming(previous, previous + delta, delta, [], [], []))
        previous += delta
    assert messages[0].content == "Sure." and messages[1].content == "\n" and not messages[1].tool_calls
    assert messages[2] is None and messages[4] is None
    (sent,) = messages[3].tool_calls
    assert (sent.index, sent.type, sent.function.name, sent.function.arguments) == (
        0, "function", "get_weather", '{"location": "北京"}')


def test_garbage_never_raises():
    rng = random.Random(11)
    alphabet = ["<tool_call>", "</tool_call>", "{", "}", '"', ":", ",", "name", "arguments", "[", "]",
                "\\", " ", "\n", "x", "1", "北", "<", "/"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        result = extract(text)
        assert isinstance(result.content, (str, type(None)))
        content, calls = stream_tool_calls(list(text))
        assert (content, calls) == (result.content or "", calls_of(result))
