"""FastDeploy's single-machine PD launch lines serve as a pair of fd-serve
instances on loopback: streaming and non-streaming greedy output equals a mixed
instance's, and the usage reports the KV bytes received."""

from __future__ import annotations

import json

import httpx
import pytest

from fd_core.metrics.prometheus import METRIC_PREFIX
from fd_core.models.config import load_config
from tests.disagg.instances import free_port
from tests.entrypoints.server_process import Server, gauge, sse_events, tiny_server_args

pytestmark = pytest.mark.slow
PROMPTS = ["the prefill instance computes", "a decode instance continues from the first token of this prompt"]


def _complete(url: str, prompt: str, stream: bool) -> tuple[str, dict]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "stream": stream, "stream_options": {"include_usage": True}}
    if not stream:
        r = httpx.post(url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        data = r.json()
        return data["choices"][0]["text"], data["usage"]
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        events = sse_events(list(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"]), chunks[-1]["usage"]


def test_a_prefill_and_a_decode_instance_answer_as_one_mixed_instance(checkpoint_factory, tmp_path, monkeypatch):
    model = checkpoint_factory("tiny-dense", "pytorch")
    monkeypatch.setenv("FD_PD_TRANSFER_TIMEOUT", "2")
    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("FD_PD_ALLOWED_PREFILL_ADDRS", dead)  # a header may name it, beyond --innode-prefill-ports
    queue_port = free_port()
    prefill = Server(tiny_server_args(model, "--engine-worker-queue-port", str(queue_port),
                                      "--cache-queue-port", str(free_port()), "--splitwise-role", "prefill"),
                     tmp_path / "prefill.log")
    decode = Server(tiny_server_args(model, "--engine-worker-queue-port", str(free_port()),
                                     "--cache-queue-port", str(free_port()),
                                     "--innode-prefill-ports", str(queue_port), "--splitwise-role", "decode"),
                    tmp_path / "decode.log")
    mixed = Server(tiny_server_args(model), tmp_path / "mixed.log")
    servers = [prefill, decode, mixed]
    try:
        for s in servers:
            s.wait_ready(180)
        config = load_config(model)
        per_block = config.num_layers * 2 * 16 * config.num_kv_heads * config.head_dim * 4
        for prompt in PROMPTS:
            for stream in (False, True):
                text, used = _complete(decode.url, prompt, stream)
                expected, plain = _complete(mixed.url, prompt, stream)
                assert text == expected, (prompt, stream)
                assert "kv_transfer_bytes" not in plain
                blocks = -(-used["prompt_tokens"] // 16) - used["prompt_tokens_details"]["cached_tokens"] // 16
                assert used["kv_transfer_bytes"] == blocks * per_block, json.dumps(used)
        assert gauge(decode, METRIC_PREFIX + "kv_transfer_bytes_total") > 0
        assert gauge(mixed, METRIC_PREFIX + "kv_transfer_bytes_total") == 0
        # the router's choice of prefill instance: a dead one fails the request naming it, in 2 s
        body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 4}
        r = httpx.post(decode.url + "/v1/completions", json=body, headers={"x-fd-prefill-addr": dead}, timeout=60)
        assert r.status_code == 502 and f"prefill instance {dead} did not answer" in r.json()["error"]["message"], r.text
        with httpx.stream("POST", decode.url + "/v1/completions", json={**body, "stream": True}, timeout=60,
                          headers={"x-fd-prefill-addr": dead}) as resp:  # before any byte: an error, not a stream
            assert resp.status_code == 502 and "did not answer" in resp.read().decode()
        # an address neither in --innode-prefill-ports nor allowed: refused, its KV never taken
        stranger = f"127.0.0.1:{free_port()}"
        r = httpx.post(decode.url + "/v1/completions", json=body, headers={"x-fd-prefill-addr": stranger}, timeout=60)
        assert r.status_code == 502 and "is not one of this decode instance's prefill instances" in r.text, r.text
        r = httpx.post(decode.url + "/v1/completions", json=body, headers={"x-fd-prefill-addr": "nowhere"}, timeout=60)
        assert r.status_code == 400 and "x-fd-prefill-addr must be host:port" in r.text
        r = httpx.post(decode.url + "/v1/completions", json=body, timeout=60,
                       headers={"x-fd-prefill-addr": f"127.0.0.1:{queue_port}"})
        assert r.json()["choices"][0]["finish_reason"] == "length"
    finally:
        for s in servers:
            s.stop()
