"""A rank that fails to load, or hangs before the rendezvous, fails the engine within a
bounded time with an error naming the rank and the cause; no process is left. A rank
that dies under a server: requests get 503 and the server exits 1."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from fd_core import envs
from fd_core.backends import get_backend
from fd_core.parallel import driver
from fd_core.parallel.driver import ParallelRunner, TensorParallelError
from fd_core.quantization import parse_quantization
from fd_core.testing.process_tree import alive, descendants, wait_gone
from tests.parallel.failing_runner import Rank1CannotReadItsShard


def _children_after(before: set[int]) -> list[int]:
    return alive(sorted(set(descendants(os.getpid())) - before))


@pytest.mark.parametrize("quantization", [None, "wint8"])
def test_a_rank_that_cannot_read_its_shard_is_named_with_its_cause(checkpoint_factory, quantization):
    # wint8: rank 0 is then inside a load-time collective (the row-parallel scales) when rank 1 fails
    model = checkpoint_factory("tiny-dense", "pytorch")
    quant = parse_quantization(quantization, "Ernie4_5ForCausalLM") if quantization else None
    before = set(descendants(os.getpid()))
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"(?s)tensor-parallel rank 1 .*failed to start: .*"
                                                  r"OSError: cannot read .*model\.safetensors"):
        ParallelRunner(Rank1CannotReadItsShard, model, get_backend("cpu"), 2, max_model_len=256,
                       quantization=quant)
    assert time.monotonic() - start < 60
    assert not _children_after(before)


def test_a_rank_hung_before_the_rendezvous_times_out_naming_it(checkpoint_factory, monkeypatch):
    model = checkpoint_factory("tiny-dense", "pytorch")
    monkeypatch.setenv("FD_TP_RENDEZVOUS_TIMEOUT", "3")
    monkeypatch.setattr(driver, "STOP_TIMEOUT_S", 1.0)
    envs.reset()
    started = ParallelRunner._start

    def start_then_freeze(self, *args):  # rank 1 stops before it reaches the rendezvous: a hang
        proc: subprocess.Popen[bytes] = started(self, *args)
        os.kill(proc.pid, signal.SIGSTOP)
        return proc

    monkeypatch.setattr(ParallelRunner, "_start", start_then_freeze)
    before = set(descendants(os.getpid()))
    t0 = time.monotonic()
    try:
        with pytest.raises(TensorParallelError, match=r"tensor-parallel rendezvous at 127\.0\.0\.1:\d+ timed out after "
                                                      r"3 s: rank 1 never reached it \(still starting, or hung\)"):
            ParallelRunner(Rank1CannotReadItsShard, model, get_backend("cpu"), 2, max_model_len=256)
    finally:
        monkeypatch.undo()
        envs.reset()
    assert time.monotonic() - t0 < 30
    assert not _children_after(before)


@pytest.mark.slow
def test_a_dead_rank_under_the_server_gives_503_and_exit_1(checkpoint_factory, tmp_path):
    from tests.entrypoints.server_process import Server, tiny_server_args

    model = checkpoint_factory("tiny-dense", "pytorch")
    srv = Server(tiny_server_args(model, "--tensor-parallel-size", "2"), tmp_path / "server.log")
    try:
        srv.wait_ready()
        tree = srv.descendants()
        engine = srv.engine_pid()
        workers = [p for p in tree if p != engine and p in descendants(engine)]
        assert workers
        os.kill(workers[0], signal.SIGKILL)
        body = {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0}
        reply = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert reply.status_code == 503, reply.text
        assert srv.proc.wait(timeout=60) == 1
    finally:
        srv.stop()
    log = srv.log_path.read_text()
    assert "tensor-parallel rank 1" in log and "SIGKILL" in log, log
    assert not wait_gone(tree, 15)
