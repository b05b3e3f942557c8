"""Bad requests get OpenAI-style 4xx errors naming the problem; the server keeps serving."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from tests.entrypoints.openai.conftest import MAX_MODEL_LEN, MODEL
from tests.entrypoints.openai.helpers import GREEDY, assert_error
from tests.entrypoints.openai.streaming_transport import StreamingASGITransport

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

# (path, body, status, words the message must contain, param)
BAD_REQUESTS = [
    (CHAT, {"messages": USER, "n": "two"}, 400, ["n"], "n"),
    (CHAT, {"messages": USER, "temperature": "hot"}, 400, ["temperature"], "temperature"),
    (CHAT, {"messages": "hello"}, 400, ["messages"], "messages"),
    (CHAT, {"messages": []}, 400, ["messages"], "messages"),
    (CHAT, {}, 400, ["messages", "Field required"], "messages"),
    (CHAT, {"messages": [{"content": "no role"}]}, 400, ["messages[0].role"], "messages[0].role"),
    (CHAT, {"messages": USER, "stream": {"a": 1}}, 400, ["stream"], "stream"),
    (CHAT, {"messages": USER, "model": "gpt-4"}, 404, ["The model `gpt-4` does not exist."], "model"),
    (CHAT, {"messages": USER, "max_tokens": 10_000}, 400,
     [f"maximum context length is {MAX_MODEL_LEN} tokens", "10000 in the completion"], "max_tokens"),
    (CHAT, {"messages": USER, "max_completion_tokens": 0}, 400, ["max_completion_tokens", "at least 1"],
     "max_completion_tokens"),
    (CHAT, {"messages": [{"role": "user", "content": "fox " * 400}]}, 400,
     [f"maximum context length is {MAX_MODEL_LEN} tokens", "input tokens"], "messages"),
    (CHAT, {"messages": USER, "temperature": -1}, 400, ["temperature must be"], "temperature"),
    (CHAT, {"messages": USER, "top_p": 0}, 400, ["top_p must be in (0, 1]"], "top_p"),
    (CHAT, {"messages": USER, "top_k": -5}, 400, ["top_k"], "top_k"),
    (CHAT, {"messages": USER, "n": 0}, 400, ["n must be"], "n"),
    (CHAT, {"messages": USER, "n": 10**9}, 400, ["n must be at most 128"], "n"),
    (CHAT, {"messages": USER, "stop_token_ids": [10**9]}, 400, ["outside the vocabulary"], "stop_token_ids"),
    (CHAT, {"messages": USER, "logit_bias": {"999999999": 1}}, 400, ["outside the vocabulary"], "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "bad_words_token_ids": [[10**9]]}, 400, ["outside the vocabulary"],
     "bad_words_token_ids"),
    (CHAT, {"messages": USER, "presence_penalty": 3}, 400, ["presence_penalty"], "presence_penalty"),
    (CHAT, {"messages": USER, "repetition_penalty": 0}, 400, ["repetition_penalty"], "repetition_penalty"),
    (CHAT, {"messages": USER, "min_tokens": 9, "max_tokens": 3}, 400, ["min_tokens"], "min_tokens"),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 50}, 400, ["logprobs"], "logprobs"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, ["top_logprobs needs logprobs"], "top_logprobs"),
    (CHAT, {"messages": USER, "logit_bias": {"5": 500}}, 400, ["logit_bias"], "logit_bias"),
    (CHAT, {"messages": USER, "stop_token_ids": [-1]}, 400, ["stop_token_ids"], "stop_token_ids"),
    (CHAT, {"messages": USER, "stop": [""]}, 400, ["stop"], "stop"),
    (CHAT, {"messages": USER, "max_streaming_response_tokens": 0}, 400, ["max_streaming_response_tokens"],
     "max_streaming_response_tokens"),
    (CHAT, {"messages": USER, "tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, 400, ["tool_choice", "'g'"], "tool_choice"),
    (CHAT, {"messages": USER, "response_format": {"type": "json_object"}, "guided_regex": "a"}, 400,
     ["guided_regex and response_format"], "response_format"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, ["chat template", "wizard"], "messages"),
    (COMPLETIONS, {"prompt": "hi", "suffix": "end"}, 400, ["suffix is not supported"], "suffix"),
    (COMPLETIONS, {"prompt": []}, 400, ["prompt must not be empty"], "prompt"),
    (COMPLETIONS, {"prompt": ""}, 400, ["prompt is empty"], "prompt"),
    (COMPLETIONS, {"prompt": [1, 2, 10**9]}, 400, ["outside the vocabulary"], "prompt"),
    (COMPLETIONS, {"prompt": [1.5, 2]}, 400, ["prompt"], "prompt"),
    (COMPLETIONS, {"prompt": "x " * 300}, 400, [f"maximum context length is {MAX_MODEL_LEN} tokens"], "prompt"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": MAX_MODEL_LEN}, 400,
     [f"maximum context length is {MAX_MODEL_LEN} tokens", f"{MAX_MODEL_LEN} in the completion"], "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 21}, 400, ["logprobs"], "logprobs"),
    (COMPLETIONS, {"prompt": "hi", "model": "nope"}, 404, ["The model `nope` does not exist."], "model"),
    ("/detokenize", {"tokens": [10**9]}, 400, ["outside the vocabulary"], "tokens"),
    ("/tokenize", {}, 400, ["exactly one of prompt or messages"], "prompt"),
]


@pytest.mark.parametrize("stream", [False, True])
async def test_bad_requests_get_a_4xx_naming_the_problem(http, stream):
    for path, body, status, words, param in BAD_REQUESTS:
        if stream and path not in (CHAT, COMPLETIONS):
            continue
        generation = path in (CHAT, COMPLETIONS) and "stream" not in body
        r = await http.post(path, json={**body, "stream": stream} if generation else body)
        error = assert_error(r, status, *words)
        assert error["param"] == param, (body, error)
    # and the engine still serves
    ok = await http.post(CHAT, json={"messages": USER, "max_tokens": 2, **GREEDY})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


async def test_malformed_json_and_wrong_content(http):
    r = await http.post(CHAT, content=b'{"messages": [', headers={"content-type": "application/json"})
    assert_error(r, 400, "not valid JSON")
    r = await http.post(CHAT, content=b"[1, 2]", headers={"content-type": "application/json"})
    assert_error(r, 400)
    r = await http.get(CHAT)
    assert_error(r, 405)
    r = await http.get("/v1/nothing-here")
    assert_error(r, 404)


async def test_unknown_fields_are_a_400_naming_them(http):
    r = await http.post(CHAT, json={"messages": USER, "max_tokens": 2, "frobnicate": {"secret": "hunter2"},
                                    **GREEDY})
    error = assert_error(r, 400, "Unknown field 'frobnicate' in the request body; fd-core does not support it")
    assert error["param"] == "frobnicate" and "hunter2" not in r.text  # values are never echoed
    r = await http.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2, "a_field": 1, "b_field": 2})
    assert_error(r, 400, "Unknown fields 'a_field', 'b_field'")
    r = await http.post(CHAT, json={"messages": USER, "stream": True, "stream_options": {"nope": 1}})
    assert_error(r, 400, "Unknown field 'stream_options.nope'")
    # chat messages and tools keep extra keys: they reach the chat template
    r = await http.post(CHAT, json={"messages": [{"role": "user", "content": "hi", "x_tag": 1}], "tools": [
        {"type": "function", "function": {"name": "f", "x_extra": 2}, "x_more": 3}], "max_tokens": 1})
    assert r.status_code == 200, r.text


async def test_openai_client_sees_typed_errors(openai_client):
    import openai

    with pytest.raises(openai.NotFoundError) as info:
        await openai_client.chat.completions.create(model="gpt-4", messages=USER)
    assert "does not exist" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        await openai_client.completions.create(model=MODEL, prompt="hi", max_tokens=10**5)
    assert "maximum context length" in info.value.message


async def test_api_key(engine_client):
    app = build_app(engine_client, ServerArgs(served_model_names=(MODEL,), api_key="sekret"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        body = {"messages": USER, "max_tokens": 1}
        assert_error(await http.post(CHAT, json=body), 401, "API key")
        assert_error(await http.post(CHAT, json=body, headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(await http.get("/v1/models"), 401)
        assert_error(await http.post("/tokenize", json={"prompt": "x"}), 401)
        assert (await http.post(CHAT, json=body, headers={"Authorization": "Bearer sekret"})).status_code == 200
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.get("/version")).status_code == 200
        for docs in ("/docs", "/openapi.json"):  # the API's description needs the key too
            assert_error(await http.get(docs), 401)
            assert (await http.get(docs, headers={"Authorization": "Bearer sekret"})).status_code == 200


async def test_fastapi_docs_can_be_turned_off(engine_client):
    app = build_app(engine_client, ServerArgs(served_model_names=(MODEL,), fastapi_docs=False))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
        for docs in ("/docs", "/redoc", "/openapi.json"):
            assert (await http.get(docs)).status_code == 404
        assert (await http.get("/health")).status_code == 200


async def test_over_max_concurrency_is_429(engine_client):
    app = build_app(engine_client, ServerArgs(served_model_names=(MODEL,), max_concurrency=1))
    async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://fd", timeout=60) as http:
        long = {"messages": USER, "max_tokens": 200, "stream": True, **GREEDY}
        async with http.stream("POST", CHAT, json=long) as first:
            assert first.status_code == 200
            second = await http.post(CHAT, json={"messages": USER, "max_tokens": 2})
            error = assert_error(second, 429, "max-concurrency")
            assert error["type"] == "RateLimitError"
            assert (await http.post(COMPLETIONS, json={"prompt": "x"})).status_code == 429
            assert (await http.get("/v1/models")).status_code == 200  # only generation is limited
        for _ in range(100):  # the slot frees once the first stream is closed
            r = await http.post(CHAT, json={"messages": USER, "max_tokens": 2})
            if r.status_code == 200:
                break
            await asyncio.sleep(0.02)
        assert r.status_code == 200, r.text


async def test_max_concurrency_counts_engine_requests_not_http_requests(engine_client):
    """Issue 14 #8: n and prompts x n are engine requests; one HTTP request of n=8 holds 8 slots."""
    limit = 8
    app = build_app(engine_client, ServerArgs(served_model_names=(MODEL,), max_concurrency=limit))
    async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://fd", timeout=60) as http:
        # alone, a request needing more than the whole limit could never run: 400 naming the field
        r = await http.post(COMPLETIONS, json={"prompt": ["a", "b", "c"], "n": 3, "max_tokens": 1})
        assert_error(r, 400, "--max-concurrency")
        assert r.json()["error"]["param"] == "n"
        r = await http.post(CHAT, json={"messages": USER, "n": limit + 1, "max_tokens": 1})
        assert_error(r, 400, "--max-concurrency")
        long = {"messages": USER, "max_tokens": 200, "stream": True, "n": limit - 1, **GREEDY}
        async with http.stream("POST", CHAT, json=long) as first:
            assert first.status_code == 200
            assert app.state.concurrency.in_flight == limit - 1
            # one slot left: a single sequence fits, two do not
            r = await http.post(COMPLETIONS, json={"prompt": ["a", "b"], "max_tokens": 1})
            assert_error(r, 429, "retry later")
            assert r.headers["retry-after"] == "1"
            r = await http.post(CHAT, json={"messages": USER, "n": 2, "max_tokens": 1})
            assert_error(r, 429, "retry later")
            r = await http.post(CHAT, json={"messages": USER, "max_tokens": 1})
            assert r.status_code == 200, r.text
        for _ in range(100):  # every slot is given back once the stream is closed
            if app.state.concurrency.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        assert app.state.concurrency.in_flight == 0
        r = await http.post(COMPLETIONS, json={"prompt": ["a", "b"], "n": 4, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 8
        assert app.state.concurrency.in_flight == 0


async def test_engine_refusal_is_a_400(http, monkeypatch, engine_client):
    from fd_core.engine.client import RequestError

    async def refuse(*args, **kwargs):
        raise RequestError("prompt refused by the engine: no room")
        yield  # pragma: no cover

    monkeypatch.setattr(engine_client, "generate", refuse)
    for stream in (False, True):
        r = await http.post(CHAT, json={"messages": USER, "max_tokens": 2, "stream": stream})
        assert_error(r, 400, "refused by the engine")
        r = await http.post(COMPLETIONS, json={"prompt": ["a", "b"], "max_tokens": 2, "stream": stream})
        assert_error(r, 400, "refused by the engine")


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", '{"prompt": "ab\\ud800cd", "max_tokens": 2}'),
    ("/v1/completions", '{"prompt": ["ok", "x\\udc00"], "max_tokens": 2}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\udfff"}], "max_tokens": 2}'),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}], "max_tokens": 2}'),
    ("/v1/completions", '{"prompt": "hi", "stop": ["\\ud800"], "max_tokens": 2}'),
])
async def test_lone_surrogates_are_a_400_naming_the_field_never_a_500(http, path, body):
    r = await http.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "not valid Unicode: a lone surrogate" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] in ("prompt", "messages", "stop")
    # a proper pair (an emoji written as two escapes) is fine
    ok = await http.post("/v1/completions", content='{"prompt": "hi \\ud83d\\ude42", "max_tokens": 2}',
                         headers={"content-type": "application/json"})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("path, field, value", [
    ("/v1/completions", "max_tokens", True),
    ("/v1/completions", "stream", "yes"),
    ("/v1/completions", "n", 2.0),
    ("/v1/completions", "temperature", "0.5"),
    ("/v1/completions", "ignore_eos", 1),
    ("/v1/chat/completions", "logprobs", "true"),
    ("/v1/chat/completions", "seed", "7"),
])
async def test_values_of_the_wrong_json_type_are_refused_not_coerced(http, path, field, value):
    body = {"max_tokens": 2, field: value}
    body.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})
    r = await http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


async def test_one_request_fans_out_to_a_bounded_number_of_sequences(http):
    from fd_core.entrypoints.openai.serving_base import MAX_SEQUENCES

    r = await http.post("/v1/completions", json={"prompt": ["a"] * 20, "n": 128, "max_tokens": 1})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "n" and f"20 prompts x n 128 = 2560 sequences; one request may ask for at most " \
        f"{MAX_SEQUENCES}" in error["message"]
    r = await http.post("/v1/completions", json={"prompt": ["a"] * 3, "n": 2, "best_of": 100, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


async def test_bad_words_are_bounded_by_their_tokens(http):
    """Issue 14 #3: the sampler compiles a request's bad words once; their tokens are bounded."""
    words = [f"word{i} " * 8 for i in range(1000)]  # within the 1024-word limit, ~2 x 16 tokens each
    r = await http.post(CHAT, json={"messages": USER, "max_tokens": 1, "bad_words": words})
    assert_error(r, 400, "at most 8192")
    r = await http.post(CHAT, json={"messages": USER, "max_tokens": 1, "bad_words": ["x" * 10_000_000]})
    assert r.status_code in (400, 413)
    r = await http.post(CHAT, json={"messages": USER, "max_tokens": 1, "bad_words": words[:10]})
    assert r.status_code == 200, r.text
