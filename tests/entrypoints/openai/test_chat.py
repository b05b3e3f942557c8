"""/v1/chat/completions on the tiny checkpoint: answers, streams, usage, sampling fields."""

from __future__ import annotations

import pytest

from tests.entrypoints.openai.conftest import MAX_MODEL_LEN, MODEL
from tests.entrypoints.openai.helpers import GREEDY, sse_events

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me about foxes"}]


async def chat(http, **body):
    body.setdefault("messages", MESSAGES)
    r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r


async def test_answer_shape_and_usage(http, engine_client):
    r = await chat(http, model=MODEL, max_tokens=6, **GREEDY)
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) == len("chatcmpl-") + 32
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    prompt = engine_client.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(engine_client.tokenizer.encode(prompt))
    assert usage["completion_tokens"] == 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + 6
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert "cached_tokens" in usage["prompt_tokens_details"]


async def test_missing_model_answers_with_the_served_name(http):
    body = (await chat(http, max_tokens=2, **GREEDY)).json()
    assert body["model"] == MODEL
    assert (await chat(http, model="alias", max_tokens=2, **GREEDY)).json()["model"] == "alias"


async def test_stream_concatenates_to_the_full_answer(http):
    full = (await chat(http, max_tokens=12, **GREEDY)).json()["choices"][0]["message"]["content"]
    r = await chat(http, max_tokens=12, stream=True, **GREEDY)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("usage" not in c for c in chunks)  # no stream_options: no usage
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == full
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])


async def test_stream_usage_options(http):
    r = await chat(http, max_tokens=5, stream=True, stream_options={"include_usage": True}, **GREEDY)
    events = sse_events(r.text)
    last = events[-2]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5
    assert all("usage" not in e for e in events[:-2])

    r = await chat(http, max_tokens=5, stream=True,
                   stream_options={"include_usage": True, "continuous_usage_stats": True}, **GREEDY)
    events = sse_events(r.text)[:-1]
    assert all("usage" in e for e in events)
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 5
    assert events[-1]["usage"]["prompt_tokens"] == events[0]["usage"]["prompt_tokens"] > 0


async def test_max_streaming_response_tokens_batches_tokens(http):
    r = await chat(http, max_tokens=9, stream=True, max_streaming_response_tokens=4, return_token_ids=True,
                   **GREEDY)
    chunks = sse_events(r.text)[:-1]
    assert "prompt_token_ids" in chunks[0]["choices"][0]["delta"]
    sizes = [len(c["choices"][0]["delta"].get("completion_token_ids", [])) for c in chunks[1:]]
    assert sizes == [4, 4, 1]


async def test_return_token_ids(http, engine_client):
    body = (await chat(http, max_tokens=4, return_token_ids=True, **GREEDY)).json()
    message = body["choices"][0]["message"]
    assert len(message["prompt_token_ids"]) == body["usage"]["prompt_tokens"]
    assert len(message["completion_token_ids"]) == 4
    assert engine_client.tokenizer.decode(message["completion_token_ids"], skip_special_tokens=True) \
        == message["content"]


async def test_max_completion_tokens_wins_and_default_fills_context(http):
    body = (await chat(http, max_tokens=9, max_completion_tokens=3, **GREEDY)).json()
    assert body["usage"]["completion_tokens"] == 3
    body = (await chat(http, **GREEDY)).json()  # no max_tokens: up to the context length
    assert body["usage"]["total_tokens"] == MAX_MODEL_LEN
    assert body["choices"][0]["finish_reason"] == "length"


async def test_n_and_seed(http):
    sampled = dict(temperature=1.0, top_p=1.0, max_tokens=8, ignore_eos=True)
    a = (await chat(http, n=3, seed=7, **sampled)).json()
    assert [c["index"] for c in a["choices"]] == [0, 1, 2]
    assert a["usage"]["completion_tokens"] == 24
    b = (await chat(http, n=3, seed=7, **sampled)).json()
    texts = [c["message"]["content"] for c in a["choices"]]
    assert texts == [c["message"]["content"] for c in b["choices"]]
    assert len(set(texts)) > 1  # the n samples differ from each other

    r = await chat(http, n=2, seed=7, stream=True, **sampled)
    chunks = sse_events(r.text)[:-1]
    streamed = ["", ""]
    for c in chunks:
        for choice in c["choices"]:
            streamed[choice["index"]] += choice["delta"].get("content", "")
    assert streamed == texts[:2]


async def test_stop_string(http):
    free = (await chat(http, max_tokens=24, **GREEDY)).json()["choices"][0]["message"]["content"]
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    body = (await chat(http, max_tokens=24, stop=[stop], **GREEDY)).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["message"]["content"] == free[: free.index(stop)]
    r = await chat(http, max_tokens=24, stop=stop, stream=True, **GREEDY)
    chunks = sse_events(r.text)[:-1]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == free[: free.index(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_logprobs_structure(http):
    body = (await chat(http, max_tokens=4, logprobs=True, top_logprobs=3, **GREEDY)).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["logprob"] <= 0 and entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert tops == sorted(tops, reverse=True)
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy takes the top one
    none = (await chat(http, max_tokens=2, **GREEDY)).json()
    assert none["choices"][0]["logprobs"] is None
    r = await chat(http, max_tokens=4, logprobs=True, top_logprobs=2, stream=True, **GREEDY)
    streamed = [e for c in sse_events(r.text)[1:-1] if c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]


async def test_cached_tokens_on_a_repeated_long_prompt(http):
    long = [{"role": "user", "content": "the history of the red fox in europe " * 8}]
    first = (await chat(http, messages=long, max_tokens=2, **GREEDY)).json()
    second = (await chat(http, messages=long, max_tokens=2, **GREEDY)).json()
    assert first["usage"]["prompt_tokens"] > 32
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_chat_template_kwargs_reach_the_template(http):
    on = (await chat(http, max_tokens=1, **GREEDY)).json()["usage"]["prompt_tokens"]
    off = (await chat(http, max_tokens=1, chat_template_kwargs={"enable_thinking": False}, **GREEDY)).json()
    assert off["usage"]["prompt_tokens"] != on


async def test_list_of_parts_content_and_tools_render(http, engine_client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "tell me "}, {"type": "text", "text": "about foxes"}]}]
    a = (await chat(http, messages=parts, max_tokens=1, **GREEDY)).json()["usage"]["prompt_tokens"]
    b = (await chat(http, messages=[{"role": "user", "content": "tell me about foxes"}], max_tokens=1,
                    **GREEDY)).json()["usage"]["prompt_tokens"]
    assert a == b
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with_tools = (await chat(http, messages=parts, tools=[tool], max_tokens=1, **GREEDY)).json()
    assert with_tools["usage"]["prompt_tokens"] > a
    none = (await chat(http, messages=parts, tools=[tool], tool_choice="none", max_tokens=1, **GREEDY)).json()
    assert none["usage"]["prompt_tokens"] == a


async def test_openai_client_chat(openai_client):
    resp = await openai_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6,
                                                       temperature=0, extra_body={"ignore_eos": True})
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 6
    stream = await openai_client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text == resp.choices[0].message.content
    assert usage.completion_tokens == 6 and usage.prompt_tokens == resp.usage.prompt_tokens
