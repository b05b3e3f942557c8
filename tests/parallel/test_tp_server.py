"""fd-serve --tensor-parallel-size 2 in a subprocess: the same greedy text as the
offline TP=1 engine, and no process left once it stops."""

from __future__ import annotations

import httpx
import pytest

from fd_core import LLM, SamplingParams
from fd_core.testing.process_tree import wait_gone
from tests.entrypoints.server_process import Server, tiny_server_args


@pytest.mark.slow
def test_tp2_server_answers_as_tp1_and_leaves_no_process(checkpoint_factory, tmp_path):
    model = checkpoint_factory("tiny-dense", "pytorch")
    srv = Server(tiny_server_args(model, "--tensor-parallel-size", "2"), tmp_path / "server.log")
    try:
        srv.wait_ready()
        tree = srv.descendants()
        body = {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0}
        reply = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        text = reply.json()["choices"][0]["text"]
    finally:
        code = srv.stop()
    assert code == 0, srv.output()
    assert len(tree) >= 2  # the engine and its worker (rank 1), at least
    assert not wait_gone(tree, 15)
    llm = LLM(model=str(model), backend="cpu", max_model_len=2048)
    expected = llm.generate(["hello world"], SamplingParams(max_tokens=8, temperature=0))[0].outputs[0].text
    assert text == expected
