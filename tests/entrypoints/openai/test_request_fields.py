"""FastDeploy's request fields work: each has an observable effect on the prompt,
the SamplingParams the engine gets, or the answer."""

from __future__ import annotations

import httpx
import pytest

from fd_core.tokenizer import Tokenizer
from tests.entrypoints.openai.helpers import GREEDY, assert_error
from tests.entrypoints.openai.recording_engine import RecordingEngineClient, post

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer(checkpoint_factory):
    return Tokenizer.from_pretrained(checkpoint_factory("tiny-dense", "pytorch"))


@pytest.fixture
def client(tokenizer):
    return RecordingEngineClient(tokenizer)


async def prompt_of(client, body, path=CHAT, **server):
    r = await post(client, path, {"max_tokens": 1, **body}, **server)
    assert r.status_code == 200, r.text
    return client.prompts[-1]


async def test_chat_prompt_token_ids_reach_the_engine_unchanged(client):
    assert await prompt_of(client, {"messages": [], "prompt_token_ids": [5, 6, 7]}) == [5, 6, 7]
    # they win over messages, and completion_token_ids are appended (an answer to continue)
    body = {"messages": USER, "prompt_token_ids": [5, 6], "completion_token_ids": [9]}
    assert await prompt_of(client, body) == [5, 6, 9]
    vocab = len(client.tokenizer)
    r = await post(client, CHAT, {"messages": [], "prompt_token_ids": [1, vocab]})
    assert assert_error(r, 400, "outside the vocabulary")["param"] == "prompt_token_ids"
    r = await post(client, CHAT, {"messages": []})
    assert assert_error(r, 400, "prompt_token_ids")["param"] == "messages"


async def test_top_level_enable_thinking_is_the_template_kwarg(client):
    default = await prompt_of(client, {"messages": USER})
    off = await prompt_of(client, {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}})
    assert off != default
    assert await prompt_of(client, {"messages": USER, "enable_thinking": False}) == off
    assert await prompt_of(client, {"messages": USER, "enable_thinking": False,
                                    "chat_template_kwargs": {"enable_thinking": False}}) == off
    # FastDeploy also reads request fields from metadata; a top-level field wins
    assert await prompt_of(client, {"messages": USER, "metadata": {"enable_thinking": False, "tag": "x"}}) == off
    assert await prompt_of(client, {"messages": USER, "enable_thinking": True,
                                    "metadata": {"enable_thinking": False}}) == default
    r = await post(client, CHAT, {"messages": USER, "enable_thinking": True,
                                  "chat_template_kwargs": {"enable_thinking": False}})
    assert assert_error(r, 400, "enable_thinking")["param"] == "enable_thinking"
    r = await post(client, CHAT, {"messages": USER, "chat_template_kwargs": {"enable_thinking": "no"}})
    assert assert_error(r, 400, "must be true or false")["param"] == "chat_template_kwargs"


async def test_request_chat_template_is_rendered_sandboxed(client):
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}!"
    assert await prompt_of(client, {"messages": USER, "chat_template": template}) \
        == client.tokenizer.encode("<user>hi!")
    # a request's template is text, never a path the server would read
    assert await prompt_of(client, {"messages": USER, "chat_template": "/etc/passwd"}) \
        == client.tokenizer.encode("/etc/passwd")
    r = await post(client, CHAT, {"messages": USER, "chat_template": "{{ ''.__class__.__mro__ }}"})
    assert assert_error(r, 400, "SecurityError")["param"] == "chat_template"
    r = await post(client, CHAT, {"messages": USER, "chat_template": template},
                   allow_request_chat_template=False)
    error = assert_error(r, 400, "chat_template", "--disallow-request-chat-template")
    assert error["param"] == "chat_template"


async def test_disable_chat_template_sends_the_message_text(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "raw "}, {"type": "text", "text": "text"}]}]
    assert await prompt_of(client, {"messages": parts, "disable_chat_template": True}) \
        == client.tokenizer.encode("raw text")
    r = await post(client, CHAT, {"messages": USER * 2, "disable_chat_template": True})
    assert assert_error(r, 400, "exactly one message")["param"] == "disable_chat_template"


async def test_fastdeploy_sampling_fields_reach_sampling_params(client):
    body = {"messages": USER, "max_tokens": 8, "reasoning_max_tokens": 5,
            "logits_processors_args": {"think_stop_sentence": "ok"}, "temp_scaled_logprobs": True,
            "top_p_normalized_logprobs": True, "include_stop_str_in_output": True, "stop": ["x"],
            "user": "u1", "trace_context": "t", "parallel_tool_calls": True, "store": False,
            "service_tier": "auto", "modalities": ["text"], "prompt_cache_key": "k", "guided_json": None,
            "include_draft_logprobs": False}
    r = await post(client, CHAT, body)
    assert r.status_code == 200, r.text
    params = client.params[-1]
    assert params.reasoning_max_tokens == 5
    assert params.logits_processors_args == {"think_stop_sentence": "ok"}
    assert params.temp_scaled_logprobs and params.top_p_normalized_logprobs
    assert params.include_stop_str_in_output and params.stop == ["x"]
    r = await post(client, COMPLETIONS, {"prompt": "hi", "temp_scaled_logprobs": True,
                                         "logits_processors_args": {"a": 1}})
    assert r.status_code == 200 and client.params[-1].temp_scaled_logprobs
    assert client.params[-1].logits_processors_args == {"a": 1}
    r = await post(client, CHAT, {"messages": USER, "max_tokens": 4, "reasoning_max_tokens": 9})
    assert assert_error(r, 400, "reasoning_max_tokens")["param"] == "reasoning_max_tokens"


@pytest.mark.parametrize("path,base", [(CHAT, {"messages": USER}), (COMPLETIONS, {"prompt": "hi"})])
async def test_bad_words_token_ids_flat_or_nested(client, path, base):
    for given, expected in (([5, 6], [[5], [6]]), ([[5, 6], [7]], [[5, 6], [7]]), ([5, [6, 7]], [[5], [6, 7]])):
        r = await post(client, path, {**base, "bad_words_token_ids": given})
        assert r.status_code == 200, r.text
        assert client.params[-1].bad_words_token_ids == expected
    r = await post(client, path, {**base, "bad_words_token_ids": [5, len(client.tokenizer)]})
    assert assert_error(r, 400, "outside the vocabulary")["param"] == "bad_words_token_ids"


async def test_response_max_tokens_caps_the_answer_when_not_thinking(client):
    r = await post(client, CHAT, {"messages": USER, "max_tokens": 20, "response_max_tokens": 3})
    assert r.status_code == 200 and client.params[-1].max_tokens == 3
    # with a reasoning parser and thinking on it would bound only the answer: refused
    r = await post(client, CHAT, {"messages": USER, "response_max_tokens": 3}, reasoning_parser="ernie_x1")
    assert assert_error(r, 400, "enable_thinking=false")["param"] == "response_max_tokens"
    r = await post(client, CHAT, {"messages": USER, "enable_thinking": False, "response_max_tokens": 3},
                   reasoning_parser="ernie_x1")
    assert r.status_code == 200 and client.params[-1].max_tokens == 3


async def test_completion_prompt_token_ids_win_over_prompt(client):
    assert await prompt_of(client, {"prompt_token_ids": [4, 5]}, COMPLETIONS) == [4, 5]
    assert await prompt_of(client, {"prompt": "ignored", "prompt_token_ids": [4, 5]}, COMPLETIONS) == [4, 5]
    r = await post(client, COMPLETIONS, {"prompt_token_ids": [[4, 5], [6]], "max_tokens": 1})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2 and client.prompts[-2:] == [[4, 5], [6]]
    r = await post(client, COMPLETIONS, {"max_tokens": 1})
    assert assert_error(r, 400, "prompt is required")["param"] == "prompt"


async def test_best_of_answers_the_n_most_likely_samples(http):
    body = {"prompt": "the fox", "max_tokens": 4, "ignore_eos": True, "temperature": 1.0, "seed": 3}
    r = await http.post(COMPLETIONS, json={**body, "n": 2, "best_of": 5})
    out = r.json()
    assert r.status_code == 200, r.text
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert all(c["logprobs"] is None for c in out["choices"])  # drawn with logprobs, not asked for
    assert out["usage"]["completion_tokens"] == 5 * 4  # every sample drawn counts
    ranked = (await http.post(COMPLETIONS, json={**body, "n": 2, "best_of": 5, "logprobs": 0})).json()
    cumulative = [sum(c["logprobs"]["token_logprobs"]) for c in ranked["choices"]]
    assert cumulative[0] >= cumulative[1]
    r = await http.post(COMPLETIONS, json={**body, "n": 3, "best_of": 2})
    assert assert_error(r, 400, "best_of must be >= n")["param"] == "best_of"
    r = await http.post(COMPLETIONS, json={**body, "best_of": 2, "stream": True})
    assert assert_error(r, 400, "cannot be streamed")["param"] == "best_of"


def test_best_keeps_the_highest_cumulative_logprobs():
    from fd_core.engine.outputs import CompletionOutput
    from fd_core.entrypoints.openai.serving_completion import _best

    outs = [CompletionOutput(i, str(i), [], cumulative_logprob=lp) for i, lp in enumerate([-5.0, -1.0, -3.0])]
    assert [c.text for c in _best(outs, 2)] == ["1", "2"]
    assert _best(outs, 3) == outs


async def test_include_logprobs_decode_token_false_leaves_prompt_tokens_undecoded(http):
    body = {"prompt": "the fox", "max_tokens": 1, "prompt_logprobs": 0, **GREEDY}
    on = (await http.post(COMPLETIONS, json=body)).json()["choices"][0]["prompt_logprobs"]
    off = (await http.post(COMPLETIONS, json={**body, "include_logprobs_decode_token": False})).json()
    positions = [p for p in off["choices"][0]["prompt_logprobs"] if p]
    assert positions and all(e["decoded_token"] is None for p in positions for e in p.values())
    assert any(e["decoded_token"] for p in on if p for e in p.values())


async def test_null_means_default_and_model_default_is_served(client):
    body = {"messages": USER, "model": "default", "n": None, "stream": None, "logprobs": None,
            "include_stop_str_in_output": None, "disable_chat_template": None, "return_token_ids": None}
    r = await post(client, CHAT, body, served_model_names=("ernie",))
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "ernie" and len(r.json()["choices"]) == 1
    r = await post(client, COMPLETIONS, {"prompt": "hi", "model": "default", "echo": None, "n": None})
    assert r.status_code == 200, r.text
    # nested objects too
    r = await post(client, CHAT, {"messages": USER, "stream": True,
                                  "stream_options": {"include_usage": None, "continuous_usage_stats": None}})
    assert r.status_code == 200, r.text


async def test_server_max_logprobs_and_tool_parser_plugin(client, tmp_path):
    r = await post(client, CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 3}, max_logprobs=2)
    assert assert_error(r, 400, "--max-logprobs")["param"] == "top_logprobs"
    r = await post(client, COMPLETIONS, {"prompt": "hi", "prompt_logprobs": 3}, max_logprobs=2)
    assert assert_error(r, 400, "--max-logprobs")["param"] == "prompt_logprobs"
    plugin = tmp_path / "server_tool_parser.py"
    plugin.write_text("from fd_core.parsers import ToolParserManager\n"
                      "from fd_core.parsers.tool_ernie_x1 import ErnieX1ToolParser\n\n"
                      "@ToolParserManager.register_module('server_test_tools')\n"
                      "class ServerToolParser(ErnieX1ToolParser):\n    pass\n")
    r = await post(client, CHAT, {"messages": USER}, tool_parser_plugin=str(plugin),
                   tool_call_parser="server_test_tools")
    assert r.status_code == 200, r.text


async def test_without_max_tokens_a_small_kv_pool_caps_the_answer_instead_of_refusing(checkpoint_factory):
    import asyncio as _asyncio

    from fd_core.config import EngineArgs
    from fd_core.engine.client import InprocEngineClient
    from fd_core.entrypoints.openai.api_server import ServerArgs as _ServerArgs
    from fd_core.entrypoints.openai.api_server import build_app as _build_app

    engine = InprocEngineClient(EngineArgs.from_kwargs(
        str(checkpoint_factory("tiny-dense", "pytorch")), backend="cpu", max_model_len=256,
        num_gpu_blocks_override=5, block_size=16))  # 64 tokens of KV, fewer than max_model_len
    try:
        app = _build_app(engine, _ServerArgs(served_model_names=("tiny",)))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
            r = await http.post("/v1/chat/completions", json={"messages": USER, "ignore_eos": True})
            assert r.status_code == 200, r.text  # before: 400, the pool cannot hold max_model_len tokens
            assert r.json()["choices"][0]["finish_reason"] == "length"
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] + usage["completion_tokens"] == 65  # 4 blocks of 16, + 1 sampled
    finally:
        await engine.shutdown()
        await _asyncio.sleep(0)
