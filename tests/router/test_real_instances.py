"""Two real fd-serve instances behind fd-router (subprocesses): one found by --instances, one
registered by fd-serve --router; answers through the router equal a direct call."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.entrypoints.server_process import Server, free_port, tiny_server_args, wait_for

PROMPTS = ["The capital of France is", "One, two, three,", "Hello there", "A B C D"]


def _text(base: str, prompt: str, stream: bool) -> tuple[str, str]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": stream}
    if not stream:
        resp = httpx.post(base + "/v1/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        return resp.json()["choices"][0]["text"], resp.headers.get("x-fd-instance", "")
    text = ""
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
        return text, resp.headers.get("x-fd-instance", "")


@pytest.mark.slow
def test_two_real_instances_behind_the_router_answer_as_a_direct_call(checkpoint_factory, tmp_path):
    model = checkpoint_factory("tiny-dense", "pytorch")
    port = free_port()
    router_url = f"http://127.0.0.1:{port}"
    b = Server(tiny_server_args(model), tmp_path / "b.log")
    log = open(tmp_path / "router.log", "w")
    router = subprocess.Popen([sys.executable, "-m", "fd_core.router.cli", "--host", "127.0.0.1", "--port",
                               str(port), "--policy", "round_robin", "--instances", b.url,
                               "--health-check-interval-secs", "0.5", "--load-poll-interval-secs", "0.5"],
                              stdout=log, stderr=subprocess.STDOUT)
    a = Server(tiny_server_args(model, "--router", f"127.0.0.1:{port}"), tmp_path / "a.log")
    try:
        a.wait_ready()
        b.wait_ready()

        def ready() -> bool:
            try:
                return httpx.get(router_url + "/health", timeout=2).json().get("mixed") == 2
            except (httpx.HTTPError, ValueError):
                return False
        wait_for(ready, 60, "both instances usable through the router")
        sources = {i["url"]: i["source"] for i in httpx.get(router_url + "/registered").json()["instances"]}
        assert sources == {a.url: "register", b.url: "flag"}
        load = httpx.get(a.url + "/load", timeout=5).json()
        assert load["role"] == "mixed" and load["total_blocks"] == 511 and load["pd_addr"] is None
        served = set()
        for stream in (False, True):
            for prompt in PROMPTS:
                direct, _ = _text(a.url, prompt, stream)
                routed, instance = _text(router_url, prompt, stream)
                assert routed == direct, (prompt, stream)
                served.add(instance)
        assert served == {a.url, b.url}
        models = httpx.get(router_url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
    finally:
        for server in (a, b):
            server.stop()
        router.terminate()
        router.wait(timeout=30)
        log.close()
