"""The real server: fd-serve in a subprocess, driven over HTTP and with the
official openai client. Engine process, lifecycle and exit codes included."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx
import pytest

from .server_process import Server

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(checkpoint_factory, tmp_path_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    srv = Server(["--model", str(model), "--backend", "cpu", "--max-model-len", "512",
                  "--max-num-seqs", "64", "--num-gpu-blocks-override", "512", "--block-size", "16",
                  "--served-model-name", "tiny"],
                 tmp_path_factory.mktemp("server") / "server.log")
    srv.wait_ready()
    yield srv
    assert srv.stop() == 0, srv.output()


def test_openai_client_chat_and_completions(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].finish_reason in ("length", "stop")
    assert 0 < chat.usage.completion_tokens <= 8
    stream = client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0, stream=True)
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    full = client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0)
    assert text == full.choices[0].text


def test_200_concurrent_streams_complete_and_free_every_block(server):
    async def one(client: httpx.AsyncClient, i: int) -> tuple[str, str | None, int]:
        body = {"model": "tiny", "prompt": f"request {i} " * (1 + i % 7), "max_tokens": 6 + i % 5,
                "temperature": 0, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        text, finish, usage = "", None, 0
        async with client.stream("POST", server.url + "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    text += choice.get("text") or ""
                    finish = choice.get("finish_reason") or finish
                if chunk.get("usage"):
                    usage = chunk["usage"]["completion_tokens"]
        return text, finish, usage

    async def run() -> list:
        limits = httpx.Limits(max_connections=250)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            return await asyncio.gather(*[one(client, i) for i in range(200)])

    before = _successes(server)
    results = asyncio.run(run())
    for i, (_, finish, usage) in enumerate(results):
        assert finish == "length", i
        assert usage == 6 + i % 5, i
    metrics = httpx.get(server.url + "/metrics").text
    assert _successes(server) - before == 200
    assert _gauge(metrics, "fastdeploy:num_requests_running") == 0
    assert _gauge(metrics, "fastdeploy:gpu_cache_usage_perc") == 0
    # greedy: under load each output equals the same request served alone
    for i in range(0, 200, 23):
        alone = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": f"request {i} " * (1 + i % 7), "max_tokens": 6 + i % 5,
            "temperature": 0, "ignore_eos": True}).json()
        assert alone["choices"][0]["text"] == results[i][0], i


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _successes(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("fastdeploy:request_success_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_unsupported_flag_fails_at_startup(tmp_path, checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    srv = Server(["--model", str(model), "--quantization", "wint2"], tmp_path / "log")
    assert srv.proc.wait(timeout=60) == 2
    assert "--quantization wint2" in srv.output() and "not implemented" in srv.output()
    srv.stop()


def test_bad_backend_fails_at_startup(tmp_path, checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    srv = Server(["--model", str(model), "--backend", "nope"], tmp_path / "log")
    assert srv.proc.wait(timeout=60) == 2
    assert "--backend nope: unknown backend 'nope'; installed:" in srv.output()
    srv.stop()


def test_bad_backend_fails_before_the_demo_checkpoint_is_generated(tmp_path):
    srv = Server(["--model", "demo", "--backend", "nosuch"], tmp_path / "log", cwd=tmp_path)
    assert srv.proc.wait(timeout=60) == 2
    assert "--backend nosuch" in srv.output() and "'nosuch'" in srv.output()
    assert not (tmp_path / "checkpoints").exists()  # the demo generates there; nothing was generated
    srv.stop()


def test_bad_lifecycle_flags_fail_at_startup(tmp_path):
    for flags, named in ((["--workers", "0"], "--workers"), (["--timeout-graceful-shutdown", "-1"],
                                                              "--timeout-graceful-shutdown")):
        srv = Server(["--model", "demo", *flags], tmp_path / "log", cwd=tmp_path)
        assert srv.proc.wait(timeout=60) == 2, srv.output()
        assert named in srv.output()
        srv.stop()
    assert not (tmp_path / "checkpoints").exists()


def test_bad_model_fails_at_startup(tmp_path):
    srv = Server(["--model", str(tmp_path / "nowhere")], tmp_path / "log")
    assert srv.proc.wait(timeout=60) == 2
    assert "nowhere" in srv.output()
    srv.stop()


def test_engine_death_fails_health_and_exits_nonzero(tmp_path, checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    srv = Server(["--model", str(model), "--backend", "cpu", "--max-model-len", "256",
                  "--num-gpu-blocks-override", "64"], tmp_path / "log")
    srv.wait_ready()
    os.kill(srv.engine_pid(), signal.SIGKILL)
    assert srv.proc.wait(timeout=30) == 1
    assert "engine process died" in srv.output()
    srv.stop()


def test_fd_bench_serve_against_the_real_server(server, tmp_path):
    from fd_core.benchmarks.cli import main as fd_bench

    code = fd_bench(["serve", "--base-url", server.url, "--model", "tiny", "--dataset-name", "random",
                     "--num-prompts", "6", "--random-input-len", "24", "--random-output-len", "8",
                     "--request-rate", "inf", "--ignore-eos", "--save-result",
                     "--result-dir", str(tmp_path), "--result-filename", "bench.json"])
    assert code == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    summary = result["summary"]
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 6 * 8
    assert summary["mean_ttft_ms"] > 0 and summary["output_throughput"] > 0


def test_engine_facts_reach_the_metrics_of_a_real_server(server):
    text = httpx.get(server.url + "/metrics").text
    assert _gauge(text, "fastdeploy:max_batch_size") == 64  # --max-num-seqs, from the engine process
    assert _gauge(text, "fastdeploy:max_gpu_block_num") == 512
    assert 'num_gpu_blocks="512"' in text


def test_the_api_process_never_imports_paddle(server):
    """DESIGN: only the engine process holds paddle (issue 15). Every kind of request first,
    so a lazy import on some request path would show."""
    body = {"model": "tiny", "max_tokens": 4, "logprobs": True, "top_logprobs": 2, "seed": 1,
            "messages": [{"role": "user", "content": "hi"}], "stop": ["zz"], "bad_words": ["x"]}
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True, "n": 2},
                      timeout=60) as r:
        assert r.status_code == 200 and "[DONE]" in r.read().decode()
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": ["a b", "c"], "max_tokens": 3, "echo": True, "prompt_logprobs": 1,
        "logprobs": 2, "best_of": 2, "repetition_penalty": 1.2, "logit_bias": {"5": 1.0}})
    assert r.status_code == 200, r.text
    assert httpx.post(server.url + "/tokenize", json={"prompt": "a b"}, timeout=10).status_code == 200
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 200
    maps = open(f"/proc/{server.proc.pid}/maps").read()
    assert "/paddle/" not in maps, [line for line in maps.splitlines() if "/paddle/" in line][:3]
    engine = open(f"/proc/{server.engine_pid()}/maps").read()
    assert "/paddle/" in engine  # the check can see paddle where it is
