"""/v1/completions: prompt forms, batch order, echo, logprobs, streaming."""

from __future__ import annotations

import pytest

from tests.entrypoints.openai.conftest import MODEL
from tests.entrypoints.openai.helpers import GREEDY, sse_events

pytestmark = pytest.mark.anyio


async def complete(http, **body):
    r = await http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r


async def test_prompt_forms_agree(http, engine_client):
    ids = engine_client.tokenizer.encode("the quick brown fox")
    by_text = (await complete(http, prompt="the quick brown fox", max_tokens=5, **GREEDY)).json()
    by_ids = (await complete(http, prompt=ids, max_tokens=5, **GREEDY)).json()
    assert by_text["id"].startswith("cmpl-") and by_text["object"] == "text_completion"
    assert by_text["model"] == MODEL
    assert by_text["choices"][0]["text"] == by_ids["choices"][0]["text"]
    assert by_text["usage"]["prompt_tokens"] == len(ids) and by_text["usage"]["completion_tokens"] == 5
    default = (await complete(http, prompt="the quick brown fox", **GREEDY)).json()
    assert default["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens


async def test_batch_choices_are_prompt_major(http, engine_client):
    prompts = ["one fox", "two foxes jump", "three"]
    singles = [(await complete(http, prompt=p, max_tokens=4, **GREEDY)).json()["choices"][0]["text"] for p in prompts]
    body = (await complete(http, prompt=prompts, n=2, max_tokens=4, **GREEDY)).json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert [c["text"] for c in body["choices"]] == [s for s in singles for _ in range(2)]
    assert body["usage"]["completion_tokens"] == 24
    token_lists = [engine_client.tokenizer.encode(p) for p in prompts]
    by_ids = (await complete(http, prompt=token_lists, max_tokens=4, **GREEDY)).json()
    assert [c["text"] for c in by_ids["choices"]] == singles
    assert by_ids["usage"]["prompt_tokens"] == sum(len(t) for t in token_lists)

    r = await complete(http, prompt=prompts, n=2, max_tokens=4, stream=True, **GREEDY)
    streamed = [""] * 6
    for event in sse_events(r.text)[:-1]:
        assert event["object"] == "text_completion"
        for c in event["choices"]:
            streamed[c["index"]] += c["text"]
    assert streamed == [s for s in singles for _ in range(2)]


async def test_echo_and_logprobs(http):
    body = (await complete(http, prompt="hello there", max_tokens=3, echo=True, logprobs=2, **GREEDY)).json()
    choice = body["choices"][0]
    plain = (await complete(http, prompt="hello there", max_tokens=3, **GREEDY)).json()["choices"][0]["text"]
    assert choice["text"] == "hello there" + plain
    lp = choice["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert len(lp["tokens"]) == 3 and lp["text_offset"][0] == len("hello there")
    assert all(len(top) <= 2 and lp["tokens"][i] in top for i, top in enumerate(lp["top_logprobs"]))
    assert "".join(lp["tokens"]) == plain

    events = sse_events((await complete(http, prompt="hello there", max_tokens=3, echo=True, logprobs=1,
                                        stream=True, **GREEDY)).text)[:-1]
    assert "".join(e["choices"][0]["text"] for e in events) == choice["text"]
    streamed = [t for e in events if e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["tokens"]]
    assert streamed == lp["tokens"]


async def test_stream_usage_and_token_ids(http):
    r = await complete(http, prompt="count", max_tokens=4, stream=True, return_token_ids=True,
                       stream_options={"include_usage": True, "continuous_usage_stats": True}, **GREEDY)
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 4
    chunks = events[:-2]
    assert all("usage" in e for e in chunks)
    assert "prompt_token_ids" in chunks[0]["choices"][0]
    assert sum(len(e["choices"][0]["completion_token_ids"]) for e in chunks) == 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_openai_client_completions(openai_client):
    resp = await openai_client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=3, temperature=0,
                                                  extra_body={"ignore_eos": True})
    assert [c.index for c in resp.choices] == [0, 1] and resp.usage.completion_tokens == 6
    stream = await openai_client.completions.create(model=MODEL, prompt="a", max_tokens=3, temperature=0,
                                                    stream=True, extra_body={"ignore_eos": True})
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == resp.choices[0].text
