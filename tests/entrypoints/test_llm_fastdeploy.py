"""FastDeploy's (and vLLM's) offline scripts run on fd-core's LLM unchanged.

Uses the scripted model (tests/plugins/fd_scripted_model, installed in the
venv) so answers are known text: ERNIE-X1-style reasoning, then an answer
or a tool call.
"""

from __future__ import annotations

import logging
import runpy
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

from fd_core import LLM, SamplingParams
from fd_core.entrypoints.llm_chat import template_kwargs_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REASONING, ANSWER = "Let me think.", "The answer is 42."
THINK_RESPOND = f"{REASONING}\n</think>\n\n<response>\n{ANSWER}\n</response>"
THINK_TOOL = ("The user wants the weather.\n</think>\n\n"
              '<tool_call>\n{"name": "get_weather", "arguments": {"location": "北京"}}\n</tool_call>')
ENGINE = dict(backend="cpu", num_gpu_blocks_override=64, max_model_len=512, block_size=16)
PARAMS = SamplingParams(max_tokens=200)
USER = [{"role": "user", "content": "What is six times seven?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    if not list(metadata.entry_points(group="fd_core.plugins", name="scripted")):
        pytest.fail("the scripted model plugin is not installed; run: "
                    "pip install --no-build-isolation -e tests/plugins/fd_scripted_model", pytrace=False)
    from fd_scripted_model import make_checkpoint

    root = tmp_path_factory.mktemp("scripted-offline")
    made: dict[str, str] = {}

    def make(name: str, script: str) -> str:
        if name not in made:
            made[name] = str(make_checkpoint(root / name, script))
        return made[name]

    return make


@pytest.fixture(scope="module")
def thinker(scripted):
    return LLM(scripted("respond", THINK_RESPOND), reasoning_parser="ernie_x1", tool_call_parser="ernie-x1",
               **ENGINE)


@pytest.fixture(scope="module")
def tool_user(scripted):
    return LLM(scripted("tool", THINK_TOOL), reasoning_parser="ernie_x1", tool_call_parser="ernie_x1", **ENGINE)


def test_fastdeploy_example_script(scripted, monkeypatch, capfd):
    monkeypatch.setattr("sys.argv", ["offline_fastdeploy.py", scripted("example", THINK_RESPOND)])
    capfd.readouterr()
    runpy.run_path(str(EXAMPLES / "offline_fastdeploy.py"), run_name="__main__")
    lines = capfd.readouterr().out.splitlines()
    assert lines == [f"chat reasoning: {REASONING!r}", f"chat answer: {ANSWER!r}"] * 2 + [
        f"generate: {THINK_RESPOND!r}"]


def test_vllm_example_script(checkpoint_factory, monkeypatch, capfd):
    monkeypatch.setattr("sys.argv", ["offline_vllm.py", str(checkpoint_factory("tiny-dense", "pytorch"))])
    capfd.readouterr()
    runpy.run_path(str(EXAMPLES / "offline_vllm.py"), run_name="__main__")
    lines = capfd.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines[:4]] == [
        "Prompt: 'Hello", "Prompt: 'The president of the United States is'",
        "Prompt: 'The capital of France is'", "Prompt: 'The future of AI is'"]
    assert all(", Generated text: " in line for line in lines[:4])
    assert len(lines) == 5 and lines[4].startswith("Chat: ")


def test_chat_splits_reasoning_in_both_access_styles(thinker):
    out = thinker.chat([USER, USER], PARAMS, use_tqdm=False)
    for o in out:
        assert (o.outputs.reasoning_content, o.outputs.text) == (REASONING, ANSWER)
        assert (o.outputs[0].reasoning_content, o.outputs[0].text) == (REASONING, ANSWER)
        assert o.outputs.finish_reason == "stop" and o.outputs.tool_calls is None
        # the tokens keep the whole answer; the reasoning part ends at "</think>"
        assert thinker.tokenizer.decode(o.outputs.token_ids, skip_special_tokens=True) == THINK_RESPOND
        assert 0 < o.outputs.reasoning_token_num < len(o.outputs.token_ids)
    # generate is text completion: no splitting
    (raw,) = thinker.generate(out[0].prompt, PARAMS, use_tqdm=False)
    assert raw.outputs.text == THINK_RESPOND and raw.outputs.reasoning_content is None


def test_chat_separates_tool_calls_only_when_tools_are_given(tool_user):
    (called,) = tool_user.chat(USER, PARAMS, use_tqdm=False, tools=TOOLS)
    sample = called.outputs
    assert sample.reasoning_content == "The user wants the weather."
    assert sample.text == "" and sample.finish_reason == "tool_calls"
    ((call,),) = [sample.tool_calls]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"location": "北京"}'}
    (plain,) = tool_user.chat(USER, PARAMS, use_tqdm=False)  # no tools: as the server, no tool parsing
    assert plain.outputs.tool_calls is None and plain.outputs.text.startswith("<tool_call>")


def test_streaming_chat_yields_split_increments(thinker, tool_user):
    reasoning, content, chunks = "", "", 0
    for chunk in thinker.chat(USER, PARAMS, use_tqdm=False, stream=True):
        assert len(chunk) == 1
        if chunk[0] is not None:
            chunks += 1
            reasoning += chunk[0].outputs.reasoning_content or ""
            content += chunk[0].outputs.text
    assert (reasoning, content) == (REASONING, ANSWER) and chunks > 3
    calls = [c for chunk in tool_user.chat(USER, PARAMS, use_tqdm=False, tools=TOOLS, stream=True)
             for c in (chunk[0].outputs.tool_calls or [])]
    assert calls and calls[0]["function"]["name"] == "get_weather"


def test_streaming_generate_matches_the_whole_result(thinker):
    prompts = ["one\nAssistant: ", "two two\nAssistant: "]
    whole = thinker.generate(prompts, PARAMS, use_tqdm=False)
    texts, ids, finished = ["", ""], [[], []], [False, False]
    for chunk in thinker.generate(prompts, PARAMS, use_tqdm=False, stream=True):
        assert len(chunk) == 2
        for i, part in enumerate(chunk):
            if part is not None:
                assert part.outputs.send_idx == len(ids[i])  # the chunk's offset in the whole output
                texts[i] += part.outputs.text
                ids[i] += part.outputs.token_ids
                finished[i] = part.finished
    assert texts == [o.outputs.text for o in whole] == [THINK_RESPOND] * 2
    assert ids == [o.outputs.token_ids for o in whole]
    assert finished == [True, True]
    # leaving a stream early takes its requests back
    stream = thinker.generate(prompts, PARAMS, use_tqdm=False, stream=True)
    next(stream)
    stream.close()
    assert not thinker.engine.has_unfinished_requests()


def test_default_sampling_runs_to_the_end_of_the_answer(thinker):
    (out,) = thinker.generate("x\nAssistant: ", use_tqdm=False)  # FastDeploy's default: no 16-token cap
    assert out.outputs.text == THINK_RESPOND and out.outputs.finish_reason == "stop"
    assert out.finished and out.error_code == 200 and out.error_msg is None
    assert out.prompt == "x\nAssistant: " and out.prompt_token_ids == thinker.tokenizer.encode("x\nAssistant: ")
    assert out.metrics.inference_start_time is not None


def test_a_bad_prompt_is_named_and_the_batch_is_taken_back(thinker):
    ok = "fine\nAssistant: "
    cases = [
        ([ok, [7] * 600, ok], ValueError, r"prompt 1 \(of 3\): the prompt has 600 tokens, but --max-model-len is 512"),
        ([[10**7], ok], ValueError, r"prompt 0 \(of 2\): prompt token id 10000000 is outside the vocabulary"),
        ([ok, ok, ""], ValueError, r"prompt 2 \(of 3\): the prompt is empty"),
        ([ok, 3.5], TypeError, r"prompt 1 \(of 2\): a prompt must be"),
        ([{"prompt": ok, "multimodal_data": {"image": []}}], ValueError,
         r"prompt 0 \(of 1\): this model \(FdScriptedForCausalLM\) takes no images"),
        ([{"prompt": ok, "promt_token_ids": [1]}], ValueError, r"unknown prompt key 'promt_token_ids'"),
    ]
    for prompts, error, message in cases:
        with pytest.raises(error, match=message):
            thinker.generate(prompts, PARAMS, use_tqdm=False)
        assert not thinker.engine.has_unfinished_requests()
        assert thinker.engine.core.scheduler.kv_cache_manager.usage == 0.0
    with pytest.raises(ValueError, match=r"conversation 1 \(of 2\): this model \(FdScriptedForCausalLM\) takes no images"):
        thinker.chat([USER, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]],
                     PARAMS, use_tqdm=False)
    with pytest.raises(ValueError, match=r"conversation 0 \(of 1\): the prompt has"):
        thinker.chat([{"role": "user", "content": "word " * 600}], PARAMS, use_tqdm=False)
    assert [o.outputs.text for o in thinker.generate([ok, ok], PARAMS, use_tqdm=False)] == [THINK_RESPOND] * 2


def test_fastdeploy_constructor_arguments(scripted, caplog):
    path = scripted("respond", THINK_RESPOND)
    with caplog.at_level(logging.INFO, logger="fd_core.config"):
        llm = LLM(model=path, tokenizer=path, enable_logprob=True, load_choices="default_v1",
                  reasoning_parser="ernie-x1", tool_call_parser="ernie_x1", chat_template=None, **ENGINE)
    assert llm.llm_engine is llm.engine and llm.get_tokenizer() is llm.tokenizer
    logged = caplog.text
    assert "--enable-logprob has no effect here" in logged
    assert "--load-choices default_v1 has no effect here" in logged
    with pytest.raises(ValueError, match="--load-choices must be one of default, default_v1, got 'dummy'"):
        LLM(model=path, load_choices="dummy", **ENGINE)
    (out,) = llm.chat(USER, SamplingParams(max_tokens=200, logprobs=2), use_tqdm=False)
    assert out.outputs.text == ANSWER and len(out.outputs.logprobs) == len(out.outputs.token_ids)
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'"):
        LLM(model=path, reasoning_parser="nope", **ENGINE)
    with pytest.raises(TypeError, match="max_num_seq"):
        LLM(model=path, max_num_seq=4)


def test_tool_parser_plugin_file(scripted, tmp_path):
    plugin = tmp_path / "my_tool_parser.py"
    plugin.write_text("from fd_core.parsers import ToolParserManager\n"
                      "from fd_core.parsers.tool_ernie_x1 import ErnieX1ToolParser\n\n"
                      "@ToolParserManager.register_module('offline_test_tools')\n"
                      "class MyToolParser(ErnieX1ToolParser):\n    pass\n")
    llm = LLM(scripted("tool", THINK_TOOL), tool_parser_plugin=str(plugin), tool_call_parser="offline_test_tools",
              **ENGINE)
    (out,) = llm.chat(USER, PARAMS, use_tqdm=False, tools=TOOLS)
    assert out.outputs.tool_calls[0]["function"]["name"] == "get_weather"
    assert out.outputs.text.startswith("The user wants the weather.")  # no reasoning parser: all content
    with pytest.raises(ValueError, match="tool-parser-plugin .*no such file"):
        LLM(scripted("tool", THINK_TOOL), tool_parser_plugin=str(tmp_path / "missing.py"), **ENGINE)


def test_fastdeploy_and_vllm_call_arguments(thinker):
    params = SamplingParams(max_tokens=200, reasoning_max_tokens=100, bad_words_token_ids=[1727, 1800],
                            logits_processors_args={}, temp_scaled_logprobs=False, top_p_normalized_logprobs=False)
    (out,) = thinker.chat(messages=USER, sampling_params=params, use_tqdm=False,
                          chat_template_kwargs={"enable_thinking": True}, chat_template=None, tools=None,
                          stream=False)
    assert out.outputs.text == ANSWER
    (out,) = thinker.generate(prompts=["a\nAssistant: "], sampling_params=[PARAMS], use_tqdm=False,
                              lora_request=None)
    assert out.outputs[0].text == THINK_RESPOND
    with pytest.raises(TypeError, match="lora_request=.*LoRA adapters are not implemented"):
        thinker.generate("a", PARAMS, lora_request=object())
    with pytest.raises(TypeError, match="priority"):
        thinker.generate("a", PARAMS, priority=[1])
    with pytest.raises(TypeError, match="'beam_width'"):
        thinker.generate("a", PARAMS, beam_width=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="continue_final_message"):
        thinker.chat(USER, PARAMS, continue_final_message=True)
    with pytest.raises(ValueError, match="chat_template_kwargs may not set tools"):
        thinker.chat(USER, PARAMS, chat_template_kwargs={"tools": []})
    with pytest.raises(ValueError, match=r"tools\[0\]: expected"):
        thinker.chat(USER, PARAMS, tools=[{"name": "f"}])
    with pytest.raises(ValueError, match="got 2 sampling params for 1 conversations"):
        thinker.chat(USER, [PARAMS, PARAMS])
    assert not thinker.engine.has_unfinished_requests()


def test_enable_thinking_on_sampling_params_reaches_the_template():
    # FastDeploy carries enable_thinking on SamplingParams too; it is read when present
    assert template_kwargs_for(None, SimpleNamespace(enable_thinking=False)) == {"enable_thinking": False}
    assert template_kwargs_for({"x": 1}, SimpleNamespace()) == {"x": 1}
    with pytest.raises(ValueError, match="conflicts with chat_template_kwargs"):
        template_kwargs_for({"enable_thinking": True}, SimpleNamespace(enable_thinking=False))


def test_n_samples_read_both_ways(thinker):
    (out,) = thinker.generate("n\nAssistant: ", SamplingParams(max_tokens=200, n=2, temperature=1.0, seed=3),
                              use_tqdm=False)
    assert len(out.outputs) == 2 and [c.index for c in out.outputs] == [0, 1]
    assert out.outputs.text == out.outputs[0].text == THINK_RESPOND



def test_sampling_params_enable_thinking_is_a_validated_template_input():
    from fd_core import SamplingParams

    assert SamplingParams(enable_thinking=False).enable_thinking is False
    assert SamplingParams().enable_thinking is None
    with pytest.raises(ValueError, match="enable_thinking must be a bool"):
        SamplingParams(enable_thinking="no")


def test_lone_surrogates_offline_are_value_errors_naming_the_prompt(checkpoint_factory):
    from fd_core import LLM, SamplingParams

    llm = LLM(str(checkpoint_factory("tiny-dense")), backend="cpu", max_model_len=64, num_gpu_blocks_override=16,
              block_size=16)
    params = SamplingParams(max_tokens=2)
    with pytest.raises(ValueError, match=r"prompt 1 \(of 3\): the text is not valid Unicode"):
        llm.generate(["ok", "\ud800", "ok"], params, use_tqdm=False)
    with pytest.raises(ValueError, match=r"conversation 0 \(of 1\): the text is not valid Unicode"):
        llm.chat([{"role": "user", "content": "hi \udfff"}], params, use_tqdm=False)
    with pytest.raises(ValueError, match="bad_words must hold valid Unicode"):
        SamplingParams(bad_words=["\ud800"])
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate("ok", params, use_tqdm=False)[0].outputs.token_ids


def test_enable_thinking_is_refused_where_no_template_renders(checkpoint_factory):
    from fd_core import LLM, SamplingParams

    llm = LLM(str(checkpoint_factory("tiny-dense")), backend="cpu", max_model_len=64, num_gpu_blocks_override=16,
              block_size=16)
    with pytest.raises(ValueError, match=r"enable_thinking=\.\.\.\) is a chat-template input"):
        llm.generate("hi", SamplingParams(max_tokens=2, enable_thinking=False), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
