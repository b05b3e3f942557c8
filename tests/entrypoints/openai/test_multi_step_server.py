"""The server over an engine with ``--num-scheduler-steps 4``: completions and chats, streamed or not, give the
text and usage of the one-step engine (the session's), several tokens a streamed chunk, and requests that need
the sampler each step (logprobs) beside greedy, sampled and stop-string ones."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fd_core.config import EngineArgs
from fd_core.engine.client import InprocEngineClient
from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from tests.entrypoints.openai.conftest import MAX_MODEL_LEN, MODEL
from tests.entrypoints.openai.helpers import GREEDY, sse_events

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def multi_client(checkpoint_factory):
    client = InprocEngineClient(EngineArgs.from_kwargs(
        str(checkpoint_factory("tiny-dense", "pytorch")), backend="cpu", max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks_override=64, block_size=16, num_scheduler_steps=4))
    yield client
    asyncio.run(client.shutdown())


@pytest.fixture
async def multi_http(multi_client):
    app = build_app(multi_client, ServerArgs(served_model_names=(MODEL,)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as client:
        yield client


async def _post(http, path, **body):
    r = await http.post(path, json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r


BODIES = [
    {"prompt": "the quick brown fox", "max_tokens": 13, **GREEDY},
    {"prompt": "one two", "max_tokens": 9, "temperature": 0},  # EOS may stop it mid-schedule
    {"prompt": "seeded", "max_tokens": 7, "temperature": 0.8, "seed": 5, **{"ignore_eos": True}},
    {"prompt": "with logprobs", "max_tokens": 6, "logprobs": 2, **GREEDY},
    {"prompt": "stop string", "max_tokens": 10, "stop": ["e"], "temperature": 0},
]


@pytest.mark.parametrize("body", BODIES, ids=["greedy", "eos", "seeded", "logprobs", "stop-string"])
async def test_completions_equal_the_one_step_engine(http, multi_http, body):
    want = (await _post(http, "/v1/completions", **body)).json()
    got = (await _post(multi_http, "/v1/completions", **body)).json()
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    assert got["usage"] == want["usage"]
    if "logprobs" in body:
        assert got["choices"][0]["logprobs"] == want["choices"][0]["logprobs"]


async def test_streamed_chats_equal_and_come_several_tokens_a_chunk(http, multi_http):
    body = {"messages": [{"role": "user", "content": "count with me"}], "max_tokens": 17, "stream": True,
            "stream_options": {"include_usage": True}, **GREEDY}
    texts, usages, chunks = [], [], []
    for client in (http, multi_http):
        events = sse_events((await _post(client, "/v1/chat/completions", **body)).text)
        assert events[-1] == "[DONE]"
        pieces = [c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"]]
        texts.append("".join(pieces))
        chunks.append(len([p for p in pieces if p]))
        usages.append(next(e["usage"] for e in events[:-1] if e.get("usage")))
    assert texts[1] == texts[0] and usages[1] == usages[0] and usages[0]["completion_tokens"] == 17
    assert chunks[1] < chunks[0]  # 4 tokens a schedule: fewer, longer deltas


async def test_concurrent_requests_mixing_greedy_and_sampled(http, multi_http):
    """Greedy and sampled requests at once: schedules of one step while a sampled request runs, several once
    the greedy ones run alone; every answer equals the one-step engine's."""
    bodies = [{"prompt": f"request {i}", "max_tokens": 5 + 3 * i, **GREEDY} for i in range(4)]
    bodies.append({"prompt": "sampled", "max_tokens": 4, "temperature": 1.0, "seed": 9, "ignore_eos": True})
    want = [r.json()["choices"][0]["text"] for r in await asyncio.gather(
        *(_post(http, "/v1/completions", **b) for b in bodies))]
    got = [r.json()["choices"][0]["text"] for r in await asyncio.gather(
        *(_post(multi_http, "/v1/completions", **b) for b in bodies))]
    assert got == want


@pytest.mark.parametrize("include", [False, True])
async def test_streamed_stop_strings_end_where_the_one_step_engine_ends(http, multi_http, include, monkeypatch):
    """A stop string met inside a schedule of 4 tokens: the stream ends at it, with the one-step engine's
    text, finish reason and usage (the tokens after it are not streamed or counted)."""
    from tests.engine.test_multi_step import _record_schedules

    plain = (await _post(http, "/v1/completions", prompt="a stop inside", max_tokens=24, **GREEDY)).json()
    text = plain["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 2]
    body = {"prompt": "a stop inside", "max_tokens": 24, "stop": [stop], "include_stop_str_in_output": include,
            "stream": True, "stream_options": {"include_usage": True}, **GREEDY}
    got, schedules = [], []
    for client in (http, multi_http):
        if client is multi_http:
            schedules = _record_schedules(monkeypatch)
        events = sse_events((await _post(client, "/v1/completions", **body)).text)
        got.append(("".join(c.get("text") or "" for e in events[:-1] for c in e["choices"]),
                    [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c.get("finish_reason")],
                    next(e["usage"] for e in events[:-1] if e.get("usage"))))
    assert got[1] == got[0] and got[0][1] == ["stop"] and got[0][2]["completion_tokens"] < 24
    assert max(schedules) == 4  # the stop-string request ran several steps a schedule
    assert got[0][0].endswith(stop) == include
