"""--ips: the ranks of a second "host" (here a second process on 127.0.0.1 with
FD_NODE_RANK=1, running the same fd-serve command) meet the master's only through the
rendezvous store and the step socket; bad --ips values fail with a clear error and
leave no process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from fd_core import LLM, SamplingParams, envs
from fd_core.parallel.driver import TensorParallelError
from fd_core.parallel.multinode import node_layout
from fd_core.testing.process_tree import alive, descendants, wait_gone

PROMPTS = ["hello world", "the quick brown fox jumps over"]
PARAMS = SamplingParams(max_tokens=6, temperature=0, logprobs=1)


def _two_free_ports() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", port + 1))
                    return int(port)
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture
def master_env(monkeypatch):
    port = _two_free_ports()
    monkeypatch.setenv("FD_MASTER_PORT", str(port))
    monkeypatch.setenv("FD_TP_RENDEZVOUS_TIMEOUT", "60")
    monkeypatch.delenv("FD_NODE_RANK", raising=False)
    envs.reset()
    yield port
    monkeypatch.undo()
    envs.reset()


def _node(model, ips: str, tp: int, env: dict[str, str], log) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "fd_core.entrypoints.openai.api_server", "--model", str(model), "--backend", "cpu",
           "--tensor-parallel-size", str(tp), "--ips", ips, "--max-model-len", "256"]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})


def _outputs(llm: LLM):
    outs = llm.generate(PROMPTS, PARAMS)
    return [(o.outputs[0].token_ids, [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outs]


@pytest.mark.slow
def test_a_second_node_process_serves_rank_1_as_tp1_would(checkpoint_factory, master_env, tmp_path):
    model = checkpoint_factory("tiny-dense", "pytorch")
    expected = _outputs(LLM(model=str(model), backend="cpu", max_model_len=256))
    before = set(descendants(os.getpid()))
    with open(tmp_path / "node1.log", "wb") as log:
        node = _node(model, "127.0.0.1,127.0.0.1", 2, {"FD_NODE_RANK": "1", "FD_MASTER_PORT": str(master_env)}, log)
        try:
            llm = LLM(model=str(model), backend="cpu", tensor_parallel_size=2, ips="127.0.0.1,127.0.0.1",
                      max_model_len=256)
            runner = llm.engine.core.runner
            assert runner.procs == [] and list(runner.channel.remote) == [0]  # rank 1 is the other node's
            got = _outputs(llm)
            runner.close()
            assert node.wait(30) == 0, (tmp_path / "node1.log").read_text()
        finally:
            if node.poll() is None:
                node.kill()
    for (t1, lp1), (t2, lp2) in zip(expected, got):
        assert t2 == t1
        assert max(abs(a - b) for a, b in zip(lp1, lp2)) <= 1e-4
    assert not alive(sorted(set(descendants(os.getpid())) - before))


def test_a_node_that_never_comes_is_named_and_nothing_is_left(checkpoint_factory, master_env, monkeypatch):
    monkeypatch.setenv("FD_TP_RENDEZVOUS_TIMEOUT", "2")
    envs.reset()
    model = checkpoint_factory("tiny-dense", "pytorch")
    before = set(descendants(os.getpid()))
    with pytest.raises(TensorParallelError, match=r"rank\(s\) 1 \(on 127\.0\.0\.1\) did not connect .* within 2 s"):
        LLM(model=str(model), backend="cpu", tensor_parallel_size=2, ips="127.0.0.1,127.0.0.1", max_model_len=256)
    assert set(descendants(os.getpid())) <= before


def test_a_node_whose_master_is_unreachable_exits_1_naming_it(checkpoint_factory, tmp_path):
    model = checkpoint_factory("tiny-dense", "pytorch")
    port = _two_free_ports()
    with open(tmp_path / "node.log", "wb") as log:
        node = _node(model, "127.0.0.1,127.0.0.2", 2,  # nothing listens at the master's port
                     {"FD_NODE_RANK": "1", "FD_MASTER_PORT": str(port), "FD_TP_RENDEZVOUS_TIMEOUT": "2"}, log)
        try:
            code = node.wait(60)
        finally:
            if node.poll() is None:
                node.kill()
    text = (tmp_path / "node.log").read_text()
    assert code == 1, text
    assert f"tensor-parallel rank 1 could not reach the master 127.0.0.1:{port + 1} within 2 s" in text
    assert not alive(descendants(node.pid))


@pytest.mark.parametrize("ips,tp,message", [
    ("127.0.0.1,127.0.0.1,127.0.0.1", 2, r"--ips lists 3 hosts, but --tensor-parallel-size 2 does not split evenly"),
    ("10.255.255.1,10.255.255.2", 2, r"--ips 10\.255\.255\.1,10\.255\.255\.2: this host .* has none of these addresses"),
    ("127.0.0.1,not-an-ip", 2, r"'not-an-ip' is not an IPv4 address"),
    ("", 2, r"--ips is empty"),
])
def test_bad_ips_are_refused_by_name(ips, tp, message, master_env):
    with pytest.raises(ValueError, match=message):
        node_layout(ips, tp)


def test_node_rank_out_of_range_and_the_layout(monkeypatch, master_env):
    monkeypatch.setenv("FD_NODE_RANK", "2")
    envs.reset()
    with pytest.raises(ValueError, match=r"FD_NODE_RANK=2, but --ips 127\.0\.0\.1,127\.0\.0\.1 lists 2 hosts"):
        node_layout("127.0.0.1,127.0.0.1", 4)
    monkeypatch.setenv("FD_NODE_RANK", "1")
    envs.reset()
    layout = node_layout(["127.0.0.1", "127.0.0.1"], 4)
    assert (layout.node_rank, layout.per_node, list(layout.local_ranks)) == (1, 2, [2, 3])
    assert (layout.master_port, layout.step_port) == (master_env, master_env + 1)


def test_bad_ips_through_llm_start_no_process(checkpoint_factory, master_env):
    model = checkpoint_factory("tiny-dense", "pytorch")
    before = set(descendants(os.getpid()))
    with pytest.raises(ValueError, match=r"--ips lists 3 hosts"):
        LLM(model=str(model), backend="cpu", tensor_parallel_size=2, ips="127.0.0.1,127.0.0.1,127.0.0.1",
            max_model_len=256)
    assert set(descendants(os.getpid())) <= before
    assert not wait_gone([], 1)
