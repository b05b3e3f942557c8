"""The offline LLM API on a generated checkpoint."""

from __future__ import annotations

import math

import pytest

from fd_core import LLM, SamplingParams
from fd_core.config import UnsupportedFeatureError


@pytest.fixture(scope="module")
def llm(checkpoint_factory):
    return LLM(str(checkpoint_factory("tiny-dense", "pytorch")), backend="cpu", max_model_len=256,
               num_gpu_blocks_override=64, block_size=16)


GREEDY = dict(temperature=0, ignore_eos=True)


def test_text_and_token_prompts_agree(llm):
    text = "The quick brown fox jumps over the lazy dog"
    ids = llm.tokenizer.encode(text)
    by_text, by_ids = llm.generate([text, ids], SamplingParams(max_tokens=8, **GREEDY), use_tqdm=False)
    assert by_text.prompt_token_ids == ids
    assert by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids
    assert by_text.outputs[0].text == llm.tokenizer.decode(by_text.outputs[0].token_ids, skip_special_tokens=True)
    assert by_text.outputs[0].finish_reason == "length"


def test_outputs_keep_prompt_order_and_metrics(llm):
    prompts = [f"prompt number {i}" * (i + 1) for i in range(5)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, **GREEDY), use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    for out in outs:
        m = out.metrics
        assert m.arrival_time <= m.first_token_time <= m.finished_time
        assert m.num_generation_tokens == 4


def test_chat_renders_the_template(llm):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    out = llm.chat(messages, SamplingParams(max_tokens=3, **GREEDY), use_tqdm=False)[0]
    expected = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert out.prompt == expected
    assert out.prompt.endswith("Assistant: ")
    thinking_off = llm.chat(messages, SamplingParams(max_tokens=3, **GREEDY), use_tqdm=False,
                            chat_template_kwargs={"enable_thinking": False})[0]
    assert thinking_off.prompt != expected


def test_stop_strings_truncate_and_finish(llm):
    free = llm.generate("stop test", SamplingParams(max_tokens=24, **GREEDY), use_tqdm=False)[0].outputs[0]
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 3]
    assert len(stop) == 3
    out = llm.generate("stop test", SamplingParams(max_tokens=24, stop=[stop], **GREEDY), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == free.text[: free.text.index(stop)]
    kept = llm.generate("stop test", SamplingParams(max_tokens=24, stop=[stop], include_stop_str_in_output=True,
                                                   **GREEDY), use_tqdm=False)[0].outputs[0]
    assert kept.text == free.text[: free.text.index(stop) + len(stop)]


def test_stop_token_ids_and_min_tokens(llm):
    free = llm.generate("token stop", SamplingParams(max_tokens=16, **GREEDY), use_tqdm=False)[0].outputs[0]
    target = free.token_ids[5]
    first = free.token_ids.index(target)
    out = llm.generate("token stop", SamplingParams(max_tokens=16, stop_token_ids=[target], **GREEDY),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == target
    # min_tokens bans the stop id until reached, so the output must change or run longer
    later = llm.generate("token stop", SamplingParams(max_tokens=16, min_tokens=first + 2,
                                                      stop_token_ids=[target], **GREEDY), use_tqdm=False)
    assert len(later[0].outputs[0].token_ids) >= first + 2


def test_n_samples_with_seed_are_reproducible(llm):
    params = SamplingParams(max_tokens=6, n=3, temperature=1.0, seed=7, ignore_eos=True)
    a = llm.generate("sample", params, use_tqdm=False)[0]
    b = llm.generate("sample", params, use_tqdm=False)[0]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert [o.index for o in a.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1


def test_logprobs_and_prompt_logprobs(llm):
    params = SamplingParams(max_tokens=5, logprobs=3, prompt_logprobs=2, **GREEDY)
    out = llm.generate("logprob check", params, use_tqdm=False)[0]
    sample = out.outputs[0]
    assert len(sample.logprobs) == 5
    for token, position in zip(sample.token_ids, sample.logprobs):
        assert token in position
        assert position[token].rank == 1  # greedy picks the most likely token
        assert 3 <= len(position) <= 4
    assert math.isclose(sample.cumulative_logprob, sum(p[t].logprob for t, p in zip(sample.token_ids, sample.logprobs)))
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for token, position in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
        assert token in position


def test_bad_inputs_are_named(llm):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match=r"prompt 0 \(of 1\): the prompt has 300 tokens.*--max-model-len is 256"):
        llm.generate([[100] * 300], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[10**7]], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(TypeError, match="a prompt must be"):
        llm.generate([3.5], SamplingParams(max_tokens=2), use_tqdm=False)
    # a failed request leaves nothing behind, and the engine keeps serving
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate("still works", SamplingParams(max_tokens=2), use_tqdm=False)[0].finished


def test_engine_arguments_are_checked(checkpoint_factory):
    model = str(checkpoint_factory("tiny-dense", "pytorch"))
    with pytest.raises(TypeError, match="max_num_seq"):
        LLM(model, max_num_seq=4)
    with pytest.raises(UnsupportedFeatureError, match=r"--quantization wint2: wint2 \(FastDeploy.s 2-bit MoE experts\) comes only from offline-quantized checkpoints"):
        LLM(model, quantization="wint2")
    with pytest.raises(ValueError, match="max_position_embeddings 2048"):
        LLM(model, backend="cpu", max_model_len=4096)


def test_abort_frees_blocks(llm):
    engine = llm.engine
    engine.add_request("to-abort", "a long running request", SamplingParams(max_tokens=50, **GREEDY))
    engine.step()
    assert engine.core.scheduler.kv_cache_manager.usage > 0
    engine.abort_request("to-abort")
    assert not engine.has_unfinished_requests()
    assert engine.core.scheduler.kv_cache_manager.usage == 0.0
