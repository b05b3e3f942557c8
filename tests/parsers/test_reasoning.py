"""Reasoning parsers: crafted outputs, streaming equal to one-shot parsing, is_reasoning_end."""

from __future__ import annotations

import random

import pytest

from fd_core.parsers import DeltaMessage, ReasoningParserManager
from tests.parsers.conftest import splits, stream_reasoning

TOOL = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "北京"}}\n</tool_call>'


def parse(name: str, text: str) -> tuple[str | None, str | None]:
    return ReasoningParserManager.get(name)(None).extract_reasoning_content(text)


@pytest.mark.parametrize("text, expected", [
    ("Let me think.\n</think>\n\n<response>\nThe answer is 42.\n</response>",
     ("Let me think.", "The answer is 42.")),
    ("<think>\nLet me think.\n</think>\n\n<response>\nHi\n</response>\n", ("Let me think.", "Hi")),
    ("still thinking about it", ("still thinking about it", None)),  # no </think>: all reasoning
    ("<think>\nstill thinking", ("still thinking", None)),
    ("r\n</think>\n\n" + TOOL, ("r", TOOL)),  # tool calls stay in content for the tool parser
    ("r\n</think>\n\n<response>\nA\n</response>\n" + TOOL + "\n",
     ("r", "A" + TOOL)),
    ("r</think>plain answer", ("r", "plain answer")),
    ("two\n\n</think>\n\n<response>\n\nline\n\n</response>", ("two\n", "line\n")),  # one "\n" before a closing tag
    ("</think>\n\n<response>\n</response>", (None, None)),
    ("r\n</think>\n\n<response>\nunfinished answer", ("r", "unfinished answer")),
    ("a < b and c <think> d", ("a < b and c <think> d", None)),
    ("r</think>ends with <respo", ("r", "ends with <respo")),  # held back, then released at the end
    ("r</think><response>\nA\n", ("r", "A\n")),  # the "\n" held for </response> is released
    ("\u601d\u8003\n</think>\n<response>\n\u7b54\u6848\n</response>", ("\u601d\u8003", "\u7b54\u6848")),
])
def test_ernie_x1(text, expected):
    assert parse("ernie_x1", text) == expected
    assert parse("ernie-x1", text) == expected


@pytest.mark.parametrize("name", ["qwen3", "ernie-45-vl", "ernie_45_vl"])
@pytest.mark.parametrize("text, expected", [
    ("<think>\nstep 1\n</think>\n\nThe answer.", ("step 1", "The answer.")),
    ("step 1\n</think>\n\nThe answer.", ("step 1", "The answer.")),
    # no </think>: all reasoning, as a stream shows it (with thinking disabled
    # in the prompt the API layer does not run the parser: all is content)
    ("no end of thinking", ("no end of thinking", None)),
    ("<think>\ncut off while thinking", ("cut off while thinking", None)),
    ("thinking ends with </thi", ("thinking ends with </thi", None)),  # a tag that never completed
    ("r</think>", ("r", None)),
    ("r</think>a <response> b", ("r", "a <response> b")),
])
def test_think_block_parsers(name, text, expected):
    assert parse(name, text) == expected


ERNIE_TEXTS = [
    "Let me think.\n</think>\n\n<response>\nThe answer is 42.\n</response>",
    "<think>\nplan\n\n</think>\n\n<response>\n\nx\n\n</response>\n\n" + TOOL + "\n" + TOOL + "\nafter",
    "r\n</think>\n\n" + TOOL,
    "thinking <thin </thi </think</think>content </respons <response>in\n</response>tail <tool_call",
    "\u4f60\u597d\n\n\n</think>\n<response>\n\u7b54\n</response>",
    "no end tag at all, only \n thoughts \n",
    "<thi",
    "",
]


STREAM_CASES = [(name, i) for name in ("ernie_x1", "qwen3", "ernie-45-vl") for i in range(len(ERNIE_TEXTS))]


@pytest.mark.parametrize("name, index", STREAM_CASES)
def test_streaming_equals_one_shot_for_any_split(name, index):
    text = ERNIE_TEXTS[index]
    want = parse(name, text)
    for deltas in splits(text, seed=index):
        reasoning, content, messages = stream_reasoning(ReasoningParserManager.get(name)(None), deltas)
        assert (reasoning or None, content or None) == want, deltas
        for msg in messages:
            assert msg.reasoning_content or msg.content  # no empty messages
            tags = ("</think>", "<response>", "</response>") if name == "ernie_x1" else ("</think>",)
            for tag in tags:
                assert tag not in (msg.reasoning_content or "") and tag not in (msg.content or "")


@pytest.mark.parametrize("name", ["ernie_x1", "qwen3"])
def test_streaming_every_prefix_agrees(name):
    """A stream cut anywhere (max_tokens) shows exactly the one-shot parse of
    what was generated: nothing is taken back or emitted twice."""
    text = ERNIE_TEXTS[1]
    rng = random.Random(7)
    for end in range(len(text) + 1):
        prefix = text[:end]
        want = parse(name, prefix)
        deltas, i = [], 0
        while i < end:
            n = rng.randint(1, 5)
            deltas.append(prefix[i : i + n])
            i += n
        reasoning, content, _ = stream_reasoning(ReasoningParserManager.get(name)(None), deltas)
        assert (reasoning or None, content or None) == want, prefix


def test_tags_split_across_deltas_are_not_emitted():
    parser = ReasoningParserManager.get("ernie_x1")(None)
    reasoning, content, messages = stream_reasoning(
        parser, ["think", "ing\n</thi", "nk>\n", "\n<resp", "onse>\nok", "\n</res", "ponse>"])
    assert (reasoning, content) == ("thinking", "ok")
    assert [(m.reasoning_content, m.content) for m in messages] == [
        ("think", None), ("ing", None), (None, "ok")]


def test_streaming_with_token_ids_and_restart():
    """The parser follows the text; a caller that starts mid-output (or reuses
    the parser for another output) is caught up from previous_text."""
    parser = ReasoningParserManager.get("ernie_x1")(None)
    before = "abc\n</think>\n\n<response>\n"
    msg = parser.extract_reasoning_content_streaming(before, before + "xyz", "xyz", [1], [1, 2], [2])
    assert msg == DeltaMessage(content="xyz")
    text = before + "xyz\n</response>"
    reasoning, content, _ = stream_reasoning(parser, [text[:9], text[9:]])  # restarts at ""
    assert (reasoning, content) == ("abc", "xyz")


def test_is_reasoning_end_with_the_real_tokenizer(tokenizer):
    think_start, think_end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    assert tokenizer.encode("<think>") == [think_start] and tokenizer.encode("</think>") == [think_end]
    for name in ("ernie_x1", "ernie-45-vl", "qwen3"):
        parser = ReasoningParserManager.get(name)(tokenizer)
        assert parser.is_reasoning_end(tokenizer.encode("some thoughts\n</think>\n\n"))
        assert parser.is_reasoning_end(tokenizer.encode("</think>\n\n<response>\nok"))
        assert not parser.is_reasoning_end(tokenizer.encode("<think>\nstill thinking"))
        assert not parser.is_reasoning_end([])
        user = [{"role": "user", "content": "hi"}]
        off = tokenizer.apply_chat_template(user, tokenize=True, enable_thinking=False)
        on = tokenizer.apply_chat_template(user, tokenize=True)
        assert parser.is_reasoning_end(off) and not parser.is_reasoning_end(on)
        # an earlier turn's reasoning in the prompt does not end this turn's
        history = [*user, {"role": "assistant", "reasoning_content": "r", "content": "a"},
                   {"role": "user", "content": "again"}]
        assert think_end in tokenizer.apply_chat_template(history, tokenize=True)
        assert not parser.is_reasoning_end(tokenizer.apply_chat_template(history, tokenize=True))
        # without a tokenizer there are no ids to look for
        assert not ReasoningParserManager.get(name)(None).is_reasoning_end([think_end])
