"""End to end: a scripted model (tests/plugins/fd_scripted_model) answers
ERNIE-X1-style text through the real engine, and the parsers split it.

Needs the plugin installed:
``pip install --no-build-isolation -e tests/plugins/fd_scripted_model``.
"""

from __future__ import annotations

import math
from importlib import metadata

import pytest

from fd_core import LLM, SamplingParams
from fd_core.parsers import ReasoningParserManager, ToolParserManager

THINK_RESPOND = "Let me think.\n</think>\n\n<response>\nThe answer is 42.\n</response>"
THINK_TOOL = (
    "The user wants the weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"location": "北京"}}\n</tool_call>'
)
ENGINE = dict(backend="cpu", num_gpu_blocks_override=64, max_model_len=512, block_size=16)
PARAMS = SamplingParams(max_tokens=200)
USER = [{"role": "user", "content": "What is six times seven?"}]


@pytest.fixture(scope="module")
def make_checkpoint(tmp_path_factory):
    if not list(metadata.entry_points(group="fd_core.plugins", name="scripted")):
        pytest.fail(
            "the scripted model plugin is not installed; run: "
            "pip install --no-build-isolation -e tests/plugins/fd_scripted_model",
            pytrace=False,
        )
    from fd_scripted_model import make_checkpoint

    root = tmp_path_factory.mktemp("scripted")
    return lambda name, script: make_checkpoint(root / name, script)


@pytest.fixture(scope="module")
def respond_llm(make_checkpoint):
    return LLM(str(make_checkpoint("respond", THINK_RESPOND)), **ENGINE)


def conversations(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"question {i}: " + "more words " * (3 * i)}] for i in range(n)]


def assert_scripted(outputs, script: str) -> None:
    for out in outputs:
        completion = out.outputs[0]
        assert completion.text == script
        assert completion.finish_reason == "stop"


def test_answers_exactly_the_script(respond_llm):
    (out,) = respond_llm.chat(USER, PARAMS, use_tqdm=False)
    assert_scripted([out], THINK_RESPOND)
    tokenizer = respond_llm.tokenizer
    assert out.outputs[0].token_ids == tokenizer.encode(THINK_RESPOND) + [
        tokenizer.convert_tokens_to_ids("<|end_of_sentence|>")]
    # sampling gives the script too, with finite logprobs
    (sampled,) = respond_llm.chat(USER, SamplingParams(max_tokens=200, temperature=1.0, seed=1, logprobs=2),
                                  use_tqdm=False)
    assert_scripted([sampled], THINK_RESPOND)
    for position in sampled.outputs[0].logprobs:
        assert all(math.isfinite(lp.logprob) for lp in position.values())


def test_batched_and_prefix_cached(respond_llm):
    outs = respond_llm.chat(conversations(5), PARAMS, use_tqdm=False)
    assert_scripted(outs, THINK_RESPOND)
    again = respond_llm.chat(conversations(5), PARAMS, use_tqdm=False)
    assert_scripted(again, THINK_RESPOND)
    assert any(out.num_cached_tokens > 0 for out in again)


def test_chunked_prefill(make_checkpoint):
    llm = LLM(str(make_checkpoint("chunked", THINK_RESPOND)), **ENGINE, max_num_batched_tokens=8,
              enable_chunked_prefill=True)
    assert_scripted(llm.chat(conversations(4), PARAMS, use_tqdm=False), THINK_RESPOND)


def test_preemption(make_checkpoint):
    llm = LLM(str(make_checkpoint("preempt", THINK_RESPOND)), **{**ENGINE, "num_gpu_blocks_override": 8})
    # a pool of 7 usable blocks of 16 tokens cannot hold six requests at once
    outs = llm.chat(conversations(6), SamplingParams(max_tokens=40), use_tqdm=False)
    assert_scripted(outs, THINK_RESPOND)
    assert llm.engine.core.scheduler.num_preemptions > 0


def test_reasoning_parser_on_the_answer(respond_llm):
    (out,) = respond_llm.chat(USER, PARAMS, use_tqdm=False)
    tokenizer = respond_llm.tokenizer
    parser = ReasoningParserManager.get("ernie_x1")(tokenizer)
    assert parser.extract_reasoning_content(out.outputs[0].text) == ("Let me think.", "The answer is 42.")
    assert parser.is_reasoning_end(out.outputs[0].token_ids)
    assert not parser.is_reasoning_end(out.prompt_token_ids)
    # streaming over the real detokenized deltas, one token at a time
    streamer = ReasoningParserManager.get("ernie-x1")(tokenizer)
    ids, previous, reasoning, content = [], "", "", ""
    for token in out.outputs[0].token_ids:
        ids.append(token)
        current = tokenizer.decode(ids, skip_special_tokens=True)
        msg = streamer.extract_reasoning_content_streaming(
            previous, current, current[len(previous):], ids[:-1], ids, [token])
        if msg is not None:
            reasoning += msg.reasoning_content or ""
            content += msg.content or ""
        previous = current
    assert (reasoning, content) == ("Let me think.", "The answer is 42.")


def test_tool_call_parser_on_the_answer(make_checkpoint):
    llm = LLM(str(make_checkpoint("tool", THINK_TOOL)), **ENGINE)
    outs = llm.chat([USER, *conversations(2)], PARAMS, use_tqdm=False,
                    tools=[{"type": "function", "function": {"name": "get_weather"}}])
    assert_scripted(outs, THINK_TOOL)
    reasoning, content = ReasoningParserManager.get("ernie_x1")(llm.tokenizer).extract_reasoning_content(
        outs[0].outputs[0].text)
    assert reasoning == "The user wants the weather."
    result = ToolParserManager.get("ernie_x1")(llm.tokenizer).extract_tool_calls(content)
    assert result.tools_called and result.content is None
    ((name, arguments),) = [(c.function.name, c.function.arguments) for c in result.tool_calls]
    assert (name, arguments) == ("get_weather", '{"location": "北京"}')
    # streaming, token by token: reasoning parser first, its content into the tool parser
    tokenizer = llm.tokenizer
    reasoner = ReasoningParserManager.get("ernie_x1")(tokenizer)
    tools = ToolParserManager.get("ernie_x1")(tokenizer)
    ids, previous, content, sent = [], "", "", []
    for token in outs[0].outputs[0].token_ids:
        ids.append(token)
        current = tokenizer.decode(ids, skip_special_tokens=True)
        msg = reasoner.extract_reasoning_content_streaming(
            previous, current, current[len(previous):], ids[:-1], ids, [token])
        previous = current
        if msg is not None and msg.content:
            tool_msg = tools.extract_tool_calls_streaming(
                content, content + msg.content, msg.content, [], [], [])
            content += msg.content
            if tool_msg is not None:
                assert not tool_msg.content
                sent += tool_msg.tool_calls
    assert [(d.index, d.function.name, d.function.arguments) for d in sent] == [
        (0, "get_weather", '{"location": "北京"}')]


def test_script_that_does_not_round_trip_is_refused(tmp_path):
    from fd_scripted_model import make_checkpoint

    with pytest.raises(ValueError, match="round-trip"):
        make_checkpoint(tmp_path, "stops early<|end_of_sentence|>")
