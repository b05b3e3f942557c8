"""Speculative decoding through the real server: fd-serve with
``--speculative-config`` answers greedy completions token for token as the
engine without speculation, streamed or not, each request's usage carries
FastDeploy's ``speculate_metrics``, and /metrics shows FastDeploy's
spec_decode counters."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from tests.entrypoints.server_process import Server

MAX_TOKENS = 16


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(4)
    out = []
    for _ in range(4):
        pattern = [int(t) for t in rng.integers(100, 2048, int(rng.integers(3, 8)))]
        out.append((pattern * 10)[: int(rng.integers(20, 60))])
    return out


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _check_speculate_usage(usage: dict) -> dict:
    """A request's FastDeploy ``speculate_metrics`` agree with its own counts."""
    spec = usage.get("speculate_metrics")
    if spec is None:  # nothing was drafted for it
        return {}
    assert spec["accepted_tokens"] == usage["completion_tokens"] == MAX_TOKENS
    accepted = spec["draft_tokens"] - spec["rejected_tokens"]
    assert 0 <= accepted <= spec["draft_tokens"]
    assert spec["accept_ratio"] == pytest.approx(accepted / MAX_TOKENS)
    assert spec["average_accept_length"] == pytest.approx(MAX_TOKENS / (MAX_TOKENS - accepted))
    return spec


@pytest.mark.slow
def test_server_with_speculation_answers_as_the_engine_without(checkpoint_factory, tmp_path):
    model = checkpoint_factory("tiny-dense", "pytorch")
    engine = dict(max_model_len=512, max_num_seqs=8, num_gpu_blocks_override=128, block_size=16)
    prompts = _prompts()
    llm = LLM(str(model), backend="cpu", **engine)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    srv = Server(["--model", str(model), "--backend", "cpu", "--max-model-len", "512", "--max-num-seqs", "8",
                  "--num-gpu-blocks-override", "128", "--block-size", "16", "--served-model-name", "tiny",
                  "--speculative-config", spec], tmp_path / "server.log")
    try:
        srv.wait_ready()
        reported: list[dict] = []
        for prompt, want in zip(prompts, expected):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}
            got = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
            assert got["choices"][0]["completion_token_ids"] == want
            reported.append(_check_speculate_usage(got["usage"]))
            streamed: list[int] = []
            stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
            with httpx.stream("POST", srv.url + "/v1/completions", json=stream_body, timeout=60) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        chunk = json.loads(line[5:])
                        for choice in chunk.get("choices") or []:
                            streamed += choice.get("completion_token_ids") or []
                        if chunk.get("usage"):
                            stream_usage = chunk["usage"]
            assert streamed == want
            reported.append(_check_speculate_usage(stream_usage))
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        drafted = _value(metrics, "fastdeploy:spec_decode_num_draft_tokens_total")
        accepted = _value(metrics, "fastdeploy:spec_decode_num_accepted_tokens_total")
        assert drafted > 0 and 0 < accepted <= drafted
        # every request's usage reported its own figures: together they are the server's totals
        assert sum(r.get("draft_tokens", 0) for r in reported) == drafted
        assert sum(r.get("draft_tokens", 0) - r.get("rejected_tokens", 0) for r in reported) == accepted
        assert _value(metrics, "fastdeploy:spec_decode_draft_acceptance_rate") == pytest.approx(accepted / drafted)
    finally:
        assert srv.stop() == 0, srv.output()
