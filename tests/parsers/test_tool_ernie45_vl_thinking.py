"""ernie-45-vl-thinking: ERNIE tool-call blocks count only when they open the answer (FastDeploy's
rule for ERNIE-4.5-VL-28B-A3B-Thinking); streamed and whole outputs agree."""

from __future__ import annotations

import json

import pytest

from fd_core.parsers import ReasoningParserManager, ToolParserManager
from tests.parsers.conftest import splits

CALL = "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": {"city": "北京"}}, ensure_ascii=False) + \
    "\n</tool_call>"


def _parser():
    return ToolParserManager.get("ernie-45-vl-thinking")(None)


def _stream(deltas: list[str]) -> tuple[str, list[tuple[str, str]]]:
    parser, previous, content, calls = _parser(), "", "", []
    for delta in deltas:
        message = parser.extract_tool_calls_streaming(previous, previous + delta, delta, [], [], [])
        previous += delta
        for m in [message]:
            if m is not None:
                content += m.content or ""
                calls += [(c.function.name, c.function.arguments) for c in m.tool_calls]
    end = parser.finish_streaming()
    if end is not None:
        content += end.content or ""
    return content, calls


@pytest.mark.parametrize("text, want_calls, want_content", [
    ("\n\n" + CALL, [("get_weather", '{"city": "北京"}')], None),
    (CALL + "\n" + CALL, [("get_weather", '{"city": "北京"}')] * 2, None),
    ("Let me look.\n" + CALL, [], "Let me look.\n" + CALL),
    ("No tools needed.", [], "No tools needed."),
])
def test_calls_only_when_they_open_the_answer(text, want_calls, want_content):
    whole = _parser().extract_tool_calls(text)
    assert [(c.function.name, c.function.arguments) for c in whole.tool_calls] == want_calls
    assert whole.tools_called == bool(want_calls) and whole.content == want_content
    for deltas in splits(text, 3):
        content, calls = _stream(deltas)
        assert calls == want_calls, deltas
        assert content == (want_content or ""), deltas


def test_both_parsers_are_registered_under_fastdeploys_name():
    assert "ernie-45-vl-thinking" in ReasoningParserManager and "ernie_45_vl_thinking" in ReasoningParserManager
    assert "ernie-45-vl-thinking" in ToolParserManager
