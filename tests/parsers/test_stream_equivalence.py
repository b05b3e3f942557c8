"""Streamed and one-shot chat parsing give the same message (issue 14, finding 6).

``ChoiceParser`` is driven both ways from the same token ids, the way the
server drives it: one-shot, ``parse`` on the decoded text; streamed,
``delta`` on the text the incremental detokenizer returns for each engine
step (one or more tokens), the last step marked ``finished``. The joined
deltas must equal the one-shot message: reasoning_content, content, tool
calls (names, arguments, count and order; ids differ) and whether calls were
made (finish_reason "tool_calls"). Checked for every reasoning parser x tool
parser pair the server offers, none included, on random outputs drawn from
the tags, tool-call JSON (valid, cut and broken) and text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fd_core.entrypoints.openai.chat_parsing import ChoiceParser, resolve_parser
from fd_core.tokenizer.detokenizer import IncrementalDetokenizer

REASONING = [None, "ernie_x1", "qwen3", "ernie-45-vl"]
TOOLS = [None, "ernie_x1"]

TAGS = ["<think>", "</think>", "<response>", "</response>", "<tool_call>", "</tool_call>"]
# tags spelled as several text tokens, and pieces of them that never complete
TAG_PIECES = ["<", "</", ">", "<tool", "_call>", "</tool", "<th", "ink>", "</th", "<resp", "onse>", "</resp"]
CALLS = [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '{"name":"f","arguments":{"a":[1,{"b":"}"}]}}',
    '{"name": "f", "arguments": "{\\"a\\": 1}"}',
    '{"name": "f"}',
    '{"name": "f", "arguments": {"a": 1,}}',  # invalid JSON
    '{"arguments": {"a": 1}}',  # no name
    '["f", {}]',  # not an object
    'get_weather(city="Paris")',
]
JSON_PIECES = ['{"name": ', '"get_weather"', ', "arguments": {', '"city": "Bei', 'jing"', "}", "{", '"', ","]
TEXT = ["\n", "\n\n", " ", "hello", " world", "北京", "It is sunny.", "x", "{braces}", "a < b > c"]


def _block(body: str, closed: bool) -> list[str]:
    return ["<tool_call>", "\n", body] + (["\n", "</tool_call>"] if closed else [])


# one "piece" is one string encoded on its own; a tag alone becomes its single token
pieces = st.one_of(
    st.sampled_from(TAGS + TAG_PIECES + JSON_PIECES + TEXT).map(lambda p: [p]),
    st.builds(_block, st.sampled_from(CALLS), st.booleans()),
    st.builds(lambda c, n: _block(c[:n], False), st.sampled_from(CALLS), st.integers(0, 40)),  # cut mid-call
    st.lists(st.sampled_from(CALLS[:4]), min_size=2, max_size=3).map(  # parallel calls
        lambda calls: [p for c in calls for p in _block(c, True)]),
    st.text(alphabet="ab {}\"<>/\n北", max_size=6).map(lambda p: [p]),
)


@dataclass(frozen=True)
class Message:
    reasoning: str
    content: str
    calls: tuple[tuple[str, str], ...]  # (name, arguments), in order
    tools_called: bool


def make_parser(reasoning: str | None, tools: str | None, tokenizer: Any, prompt_ids: list[int]) -> ChoiceParser:
    return ChoiceParser(resolve_parser("reasoning", reasoning), resolve_parser("tool-call", tools), tokenizer,
                        None, prompt_ids)


def one_shot(parser: ChoiceParser, tokenizer: Any, ids: list[int]) -> Message:
    reasoning, content, calls = parser.parse(tokenizer.decode(ids), ids)
    calls = calls or []
    for call in calls:
        assert call["id"] and call["type"] == "function"
    return Message(reasoning or "", content or "",
                   tuple((c["function"]["name"], c["function"]["arguments"]) for c in calls), parser.tools_called)


def streamed(parser: ChoiceParser, tokenizer: Any, steps: list[list[int]]) -> Message:
    """Feed ``steps`` (token ids per engine step) as the server does; join the deltas."""
    detok = IncrementalDetokenizer(tokenizer)
    reasoning, content = "", ""
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
    for n, step in enumerate(steps):
        last = n == len(steps) - 1
        text = detok.add(step) + (detok.finish() if last else "")
        fields = parser.delta(text, step, finished=last) or {}
        assert all(fields.values()), fields  # nothing empty is sent
        reasoning += fields.get("reasoning_content", "")
        content += fields.get("content", "")
        for call in fields.get("tool_calls", []):
            index = call["index"]
            if index not in calls:
                assert index == len(calls) and call["id"] and call["type"] == "function", call
                calls[index] = [call["id"], "", ""]
            else:
                assert "id" not in call, call
            calls[index][1] += call.get("function", {}).get("name") or ""
            calls[index][2] += call.get("function", {}).get("arguments") or ""
    return Message(reasoning, content, tuple((c[1], c[2]) for c in calls.values()), parser.tools_called)


@st.composite
def outputs(draw: st.DrawFn, tokenizer: Any) -> tuple[list[int], list[list[int]]]:
    """Token ids of a random output, and a random cut of them into engine steps."""
    ids = [i for group in draw(st.lists(pieces, max_size=12)) for p in group for i in tokenizer.encode(p)]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(ids) - 1)), max_size=len(ids))))
    steps = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)]) if b > a]
    if not steps or draw(st.booleans()):
        steps.append([])  # the finishing step may bring no token (a stop string, an abort)
    return ids, steps


def prompt_for(tokenizer: Any, thinking_off: bool) -> list[int]:
    # a template with enable_thinking=false pre-fills "<think>\n\n</think>\n\n"
    return tokenizer.encode("<think>\n\n</think>\n\n") if thinking_off else tokenizer.encode("hi")


@pytest.mark.parametrize("tools", TOOLS)
@pytest.mark.parametrize("reasoning", REASONING)
def test_streamed_deltas_join_to_the_one_shot_message(tokenizer, reasoning, tools):
    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(output=outputs(tokenizer), thinking_off=st.booleans())
    def check(output, thinking_off):
        ids, steps = output
        prompt = prompt_for(tokenizer, thinking_off)
        want = one_shot(make_parser(reasoning, tools, tokenizer, prompt), tokenizer, ids)
        got = streamed(make_parser(reasoning, tools, tokenizer, prompt), tokenizer, steps)
        assert got == want, (tokenizer.decode(ids), [tokenizer.decode(s) for s in steps])

    check()


# ---- fixed outputs that once parsed differently ----------------------------------------

THINK = "<think>\nThe user wants the weather in Paris.\n</think>\n\n"
# issue 14: a 48-token ERNIE X1 answer whose <tool_call> never closes; streamed, all of it vanished
UNCLOSED = ("<tool_call>\nI should call get_weather for Paris, but first let me explain "
            "what the forecast tool returns and why the answer may take a while")


def both_ways(tokenizer, text: str, reasoning: str | None = "ernie_x1", tools: str | None = "ernie_x1",
              step: int = 1) -> tuple[Message, Message]:
    ids = tokenizer.encode(text)
    prompt = prompt_for(tokenizer, False)
    steps = [ids[i:i + step] for i in range(0, len(ids), step)]
    return (one_shot(make_parser(reasoning, tools, tokenizer, prompt), tokenizer, ids),
            streamed(make_parser(reasoning, tools, tokenizer, prompt), tokenizer, steps))


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_an_unclosed_tool_call_is_content_in_both_modes(tokenizer, step):
    assert len(tokenizer.encode(UNCLOSED)) == 48
    want = Message("The user wants the weather in Paris.", UNCLOSED, (), False)
    assert both_ways(tokenizer, THINK + UNCLOSED, step=step) == (want, want)
    assert both_ways(tokenizer, UNCLOSED, reasoning=None, step=step) == (Message("", UNCLOSED, (), False),) * 2


def test_a_call_cut_by_max_tokens_is_content_and_a_complete_one_a_call(tokenizer):
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    want = Message("The user wants the weather in Paris.", cut, (), False)
    assert both_ways(tokenizer, THINK + cut) == (want, want)
    whole = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'  # </tool_call> never came
    want = Message("The user wants the weather in Paris.", "", (("get_weather", '{"city": "Paris"}'),), True)
    assert both_ways(tokenizer, THINK + whole) == (want, want)


@pytest.mark.parametrize("reasoning", REASONING)
def test_a_trailing_piece_of_a_tag_is_kept(tokenizer, reasoning):
    text = "</think>\nThe answer is 3 <" if reasoning else "The answer is 3 <"
    one, stream = both_ways(tokenizer, text, reasoning=reasoning)
    assert one == stream and one.content == "The answer is 3 <"
    one, stream = both_ways(tokenizer, "still thinking </thi", reasoning=reasoning)
    assert one == stream and one.reasoning + one.content == "still thinking </thi"


@pytest.mark.parametrize("reasoning", ["qwen3", "ernie-45-vl", "ernie_x1"])
def test_an_output_without_end_of_thinking_is_reasoning_in_both_modes(tokenizer, reasoning):
    want = Message("I was cut off while", "", (), False)
    assert both_ways(tokenizer, "<think>\nI was cut off while", reasoning=reasoning) == (want, want)


def test_whitespace_only_content_is_kept_without_calls_and_dropped_beside_them(tokenizer):
    one, stream = both_ways(tokenizer, "</think>\n\n  \n", reasoning="qwen3")
    assert one == stream and one.content == "  \n"
    one, stream = both_ways(tokenizer, '</think>\n\n<tool_call>{"name": "f"}</tool_call>\n \n', reasoning="qwen3")
    assert one == stream and one.content == "" and one.calls == (("f", "{}"),)
