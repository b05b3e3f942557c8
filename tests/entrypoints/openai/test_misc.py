"""/health, /version, /v1/models, /tokenize, /detokenize, /metrics; no paddle in the API layer."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

import fd_core
from fd_core.entrypoints.openai.api_server import ServerArgs, build_app, build_metrics_app
from fd_core.tokenizer import Tokenizer
from tests.entrypoints.openai.conftest import MAX_MODEL_LEN, MODEL
from tests.entrypoints.openai.fake_engine import ScriptedEngineClient
from tests.entrypoints.openai.helpers import GREEDY, assert_error

pytestmark = pytest.mark.anyio


def test_importing_the_api_server_does_not_import_paddle():
    code = ("import sys, fd_core.entrypoints.openai.api_server, fd_core.metrics; "
            "print(sorted(m for m in ('paddle', 'numpy', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_health_and_version(http, checkpoint_factory):
    assert (await http.get("/health")).status_code == 200
    assert (await http.get("/version")).json() == {"version": fd_core.__version__}
    dead = ScriptedEngineClient(Tokenizer.from_pretrained(checkpoint_factory("tiny-dense", "pytorch")), ["x"])
    dead.dead = True
    app = build_app(dead, ServerArgs())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as client:
        assert_error(await client.get("/health"), 503, "not serving")
        assert_error(await client.post("/v1/completions", json={"prompt": "hi"}), 503, "dead")


async def test_models(http, openai_client):
    body = (await http.get("/v1/models")).json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL, "alias"]
    assert all(m["owned_by"] == "fd-core" and m["max_model_len"] == MAX_MODEL_LEN for m in body["data"])
    assert (await http.get(f"/v1/models/{MODEL}")).json()["id"] == MODEL
    assert_error(await http.get("/v1/models/other"), 404, "does not exist")
    models = await openai_client.models.list()
    assert [m.id for m in models.data] == [MODEL, "alias"]


async def test_tokenize_and_detokenize(http, engine_client):
    tok = engine_client.tokenizer
    body = (await http.post("/tokenize", json={"prompt": "hello foxes"})).json()
    assert body["tokens"] == tok.encode("hello foxes")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == MAX_MODEL_LEN
    messages = [{"role": "user", "content": "hi"}]
    chat = (await http.post("/tokenize", json={"messages": messages, "return_token_strs": True})).json()
    assert chat["tokens"] == tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
    assert len(chat["token_strs"]) == chat["count"]
    completion = (await http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})).json()
    assert completion["usage"]["prompt_tokens"] == chat["count"]
    back = (await http.post("/detokenize", json={"tokens": body["tokens"]})).json()
    assert back == {"prompt": "hello foxes"}
    assert_error(await http.post("/detokenize", json={"tokens": ["a"]}), 400, "tokens[0]")


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_metrics_count_requests_tokens_and_latencies(http):
    before = (await http.get("/metrics")).text
    for max_tokens in (3, 5):
        r = await http.post("/v1/completions", json={"prompt": "count me", "max_tokens": max_tokens, **GREEDY})
        assert r.status_code == 200
    r = await http.post("/v1/completions", json={"prompt": "count me", "max_tokens": 20, "temperature": 0,
                                                 "stop": ["e"]})
    stopped = r.json()["choices"][0]["finish_reason"]
    resp = await http.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    after = resp.text
    delta = lambda name: metric(after, name) - metric(before, name)  # noqa: E731
    assert delta('fastdeploy:request_success_total{finished_reason="length"}') >= 2
    assert delta("fastdeploy:request_success_total") == 3
    assert delta(f'fastdeploy:request_success_total{{finished_reason="{stopped}"}}') >= 1
    assert delta("fastdeploy:requests_number_total") == 3
    assert delta("fastdeploy:prompt_tokens_total") > 0
    assert delta("fastdeploy:generation_tokens_total") >= 8
    assert delta("fastdeploy:time_to_first_token_seconds_count") == 3
    assert delta("fastdeploy:e2e_request_latency_seconds_count") == 3
    assert delta("fastdeploy:request_queue_time_seconds_count") == 3
    assert delta("fastdeploy:time_per_output_token_seconds_count") >= 2
    assert delta("fastdeploy:request_generation_tokens_count") == 3
    for gauge in ("num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc", "hit_token_rate",
                  "free_gpu_block_num", "max_gpu_block_num", "available_gpu_resource", "hit_req_rate"):
        assert f"fastdeploy:{gauge} " in after, gauge
    assert metric(after, "fastdeploy:max_gpu_block_num") == 64


async def test_metrics_port_moves_metrics_to_their_own_app(engine_client):
    app = build_app(engine_client, ServerArgs(metrics_port=9999))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as client:
        assert (await client.get("/metrics")).status_code == 404
    metrics_app = build_metrics_app(app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(metrics_app), base_url="http://fd") as client:
        r = await client.get("/metrics")
        assert r.status_code == 200 and "fastdeploy:num_requests_running" in r.text
        app.state.config_info = {"engine_args": {"max_model_len": 123}}
        info = (await client.get("/config-info")).json()  # FastDeploy serves it on the metrics port too
        assert info["engine_args"]["max_model_len"] == 123 and info["engine"]["num_kv_blocks"] == 64


async def test_apps_do_not_share_metrics(engine_client):
    a = build_app(engine_client, ServerArgs())
    b = build_app(engine_client, ServerArgs())
    assert a.state.fd.metrics.registry is not b.state.fd.metrics.registry


async def test_ping_answers_like_health(http, checkpoint_factory):
    assert (await http.get("/ping")).status_code == 200
    assert (await http.post("/ping")).status_code == 200
    dead = ScriptedEngineClient(Tokenizer.from_pretrained(checkpoint_factory("tiny-dense", "pytorch")), ["x"])
    dead.dead = True
    async with httpx.AsyncClient(transport=httpx.ASGITransport(build_app(dead, ServerArgs())),
                                 base_url="http://fd") as client:
        assert_error(await client.get("/ping"), 503, "not serving")


async def test_config_info_shows_the_effective_configuration_with_secrets_masked(engine_client, monkeypatch):
    from fd_core import envs
    from fd_core.config import EngineArgs
    from fd_core.entrypoints.openai.serving_misc import config_info

    monkeypatch.setenv("FD_API_KEY", "env-secret-1,env-secret-2")  # values nothing else in the body can hold
    monkeypatch.setenv("FD_SAMPLING_CLASS", "rejection")
    envs.reset()
    app = build_app(engine_client, ServerArgs(served_model_names=(MODEL,)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as client:
        body = (await client.get("/config-info")).json()  # without config_info: what the app knows
        assert body["engine"]["num_kv_blocks"] == 64 and body["engine"]["backend"] == "cpu"
        assert body["served_model_names"] == [MODEL] and body["max_model_len"] == MAX_MODEL_LEN
        assert body["model_config"]["architectures"] and body["model_config"]["vocab_size"] > 0
        assert body["environment"]["FD_API_KEY"] == "***"
        assert body["environment"]["FD_SAMPLING_CLASS"] == "rejection"

        args = EngineArgs(model=engine_client.info.model_dir, backend="auto", max_model_len=MAX_MODEL_LEN)
        app.state.config_info = config_info(args, {"api_keys": ("secret-1", "secret-2"), "port": 8180,
                                                   "scheduler_password": "pw", "max_concurrency": 512,
                                                   "redis_url": "redis://user:pw@host:6379"},
                                            model_dir=engine_client.info.model_dir)
        body = (await client.get("/config-info")).json()
    assert body["engine_args"]["backend"] == "auto" and body["engine"]["backend"] == "cpu"
    assert body["engine_args"]["max_model_len"] == MAX_MODEL_LEN
    server = body["server_args"]
    assert server["api_keys"] == ["***", "***"] and server["scheduler_password"] == "***"
    assert server["port"] == 8180 and server["max_concurrency"] == 512
    assert server["redis_url"] == "redis://***@host:6379"
    assert "secret-1" not in str(body) and "env-secret" not in str(body)
    envs.reset()


async def scrape(client) -> str:
    r = await client.get("/metrics")
    assert r.status_code == 200
    return r.text


async def test_metrics_are_right_before_the_first_request(engine_client):
    from tests.entrypoints.openai.test_disconnect import wait_idle

    await wait_idle(engine_client)
    app = build_app(engine_client, ServerArgs())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as client:
        text = await scrape(client)
    usable = engine_client.info.num_kv_blocks - 1
    assert metric(text, "fastdeploy:max_batch_size") == engine_client.info.max_num_seqs > 0
    assert metric(text, "fastdeploy:available_batch_size") == engine_client.info.max_num_seqs
    assert metric(text, "fastdeploy:num_requests_running") == 0 == metric(text, "fastdeploy:batch_size")
    assert metric(text, "fastdeploy:available_gpu_block_num") == usable
    assert metric(text, "fastdeploy:available_gpu_resource") == 1.0
    assert metric(text, "fastdeploy:gpu_cache_usage_perc") == 0


async def test_metrics_are_right_right_after_a_streaming_client_aborts(live_http, engine_client):
    from tests.entrypoints.openai.test_disconnect import wait_idle

    await wait_idle(engine_client)
    usable = engine_client.info.num_kv_blocks - 1
    request = {"prompt": "go on forever " * 4, "max_tokens": 180, "stream": True, **GREEDY}
    seen = 0
    async with live_http.stream("POST", "/v1/completions", json=request) as r:
        async for line in r.aiter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                busy = await scrape(live_http)
                assert metric(busy, "fastdeploy:num_requests_running") == 1
                assert metric(busy, "fastdeploy:batch_size") == 1
                assert metric(busy, "fastdeploy:available_gpu_block_num") < usable
                break
    text = ""
    for _ in range(100):  # the abort runs as the stream closes; no further request is sent
        text = await scrape(live_http)
        if metric(text, "fastdeploy:num_requests_running") == 0:
            break
        await asyncio.sleep(0.02)
    assert metric(text, "fastdeploy:num_requests_running") == 0
    assert metric(text, "fastdeploy:num_requests_waiting") == 0
    assert metric(text, "fastdeploy:available_gpu_block_num") == usable
    assert metric(text, "fastdeploy:gpu_cache_usage_perc") == 0
