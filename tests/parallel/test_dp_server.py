"""fd-serve --data-parallel-size 2 in a subprocess: the same greedy text as one engine,
both replicas serve, a killed replica fails only its own requests with an error naming
it, the last one's death stops the server (exit 1), and no process is left behind."""

from __future__ import annotations

import os
import re
import signal

import httpx
import pytest

from fd_core import LLM, SamplingParams
from fd_core.testing.process_tree import wait_gone
from tests.entrypoints.server_process import Server, tiny_server_args, wait_for

PROMPTS = ["hello world", "the quick brown fox", "a", "one two three"]


def _replica_pids(srv: Server) -> list[int]:
    found = dict(re.findall(r"data-parallel replica (\d+) of 2: engine pid (\d+)", srv.log_path.read_text()))
    return [int(found[k]) for k in sorted(found)]


def _complete(srv: Server, prompt: str, max_tokens: int = 8) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(srv.url + "/v1/completions", json=body, timeout=60)


@pytest.mark.slow
def test_dp2_server_answers_as_one_engine_and_both_replicas_serve(checkpoint_factory, tmp_path):
    model = checkpoint_factory("tiny-dense", "pytorch")
    srv = Server(tiny_server_args(model, "--data-parallel-size", "2"), tmp_path / "server.log")
    try:
        srv.wait_ready()
        tree = srv.descendants()
        texts = []
        for prompt in PROMPTS:
            reply = _complete(srv, prompt)
            assert reply.status_code == 200, reply.text
            texts.append(reply.json()["choices"][0]["text"])
        log = srv.output()
    finally:
        code = srv.stop()
    assert code == 0, srv.log_path.read_text()
    pids = _replica_pids(srv)
    assert len(set(pids)) == 2 and set(pids) <= set(tree)
    for i, pid in enumerate(pids):  # requests taken in turn: each replica finished two
        assert len(re.findall(rf"data-parallel replica {i} \(engine pid {pid}\) finished request", log)) == 2, log
    assert not wait_gone(tree, 15)
    llm = LLM(model=str(model), backend="cpu", max_model_len=2048)
    expected = [o.outputs[0].text for o in llm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0))]
    assert texts == expected


@pytest.mark.slow
def test_a_killed_replica_fails_its_requests_by_name_and_the_last_stops_the_server(checkpoint_factory, tmp_path):
    model = checkpoint_factory("tiny-dense", "pytorch")
    srv = Server(tiny_server_args(model, "--data-parallel-size", "2"), tmp_path / "server.log")
    try:
        srv.wait_ready()
        tree = srv.descendants()
        first, second = _replica_pids(srv)
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 1900, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # streaming, on replica 0
            os.kill(first, signal.SIGKILL)
            rest = "\n".join(lines)
        assert "data-parallel replica 0" in rest and "died" in rest, rest
        wait_for(lambda: "data-parallel replica 0 (engine pid" in srv.output() and "1 of 2 replicas serve on"
                 in srv.output(), 15, "the dead replica logged")
        reply = _complete(srv, "hello world")  # the other replica serves on
        assert reply.status_code == 200, reply.text
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        os.kill(second, signal.SIGKILL)
        code = srv.wait(30)
    finally:
        srv.stop()
    log = srv.log_path.read_text()
    assert code == 1, log
    assert "data-parallel replica 1 (engine pid" in log and "0 of 2 replicas serve on" in log, log
    assert not wait_gone(tree, 15)


def test_data_parallel_offline_is_refused_with_what_to_do(checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    with pytest.raises(Exception, match=r"data_parallel_size=2: one engine core is one replica; fd-serve "
                                        r"--data-parallel-size 2"):
        LLM(model=str(model), backend="cpu", data_parallel_size=2, max_model_len=256)


def test_data_parallel_size_must_be_positive():
    from fd_core.config import EngineArgs

    with pytest.raises(ValueError, match=r"--data-parallel-size must be a positive integer, got 0"):
        EngineArgs.from_kwargs("m", data_parallel_size=0)
