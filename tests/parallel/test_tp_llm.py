"""TP=2 through the offline LLM: greedy tokens equal to TP=1, logprobs close;
a dead worker fails the engine by name; no process outlives the engine."""

from __future__ import annotations

import os
import signal

import pytest

from fd_core import LLM
from fd_core.parallel.driver import TensorParallelError
from fd_core.testing.process_tree import alive, descendants, wait_gone
from tests.parallel.greedy_runs import PARAMS, PROMPTS, greedy_run

_run = greedy_run


def _assert_same(one, two, tol):
    for (tokens1, lps1), (tokens2, lps2) in zip(one, two):
        assert tokens2 == tokens1
        assert max(abs(a - b) for a, b in zip(lps1, lps2)) <= tol


@pytest.mark.parametrize("shape,naming", [
    ("tiny-dense", "pytorch"),
    pytest.param("tiny-moe", "paddle", marks=pytest.mark.slow),
])
def test_tp2_greedy_tokens_equal_tp1(checkpoint_factory, shape, naming):
    model = checkpoint_factory(shape, naming)
    before = set(descendants(os.getpid()))
    _assert_same(_run(model, 1), _run(model, 2), 1e-4)
    assert not alive(sorted(set(descendants(os.getpid())) - before))


@pytest.mark.slow
@pytest.mark.parametrize("shape,naming", [("tiny-dense", "paddle"), ("tiny-moe", "pytorch")])
def test_tp4_greedy_tokens_equal_tp1(checkpoint_factory, shape, naming):
    # 4 ranks: the tiny models' 2 KV heads are replicated (ranks 0-1 share head 0, ranks 2-3 head 1)
    model = checkpoint_factory(shape, naming)
    before = set(descendants(os.getpid()))
    _assert_same(_run(model, 1), _run(model, 4), 1e-4)
    assert not alive(sorted(set(descendants(os.getpid())) - before))


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
def test_tp2_wint8_greedy_tokens_equal_wint8_tp1(checkpoint_factory, shape):
    # a row-parallel rank quantizes its rows with the whole column's scales (tests/parallel/test_tp_quant.py)
    model = checkpoint_factory(shape, "pytorch")
    _assert_same(_run(model, 1, quantization="wint8"), _run(model, 2, quantization="wint8"), 1e-3)


def test_a_dead_worker_fails_the_engine_by_name_and_leaves_no_process(checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    llm = LLM(model=str(model), backend="cpu", tensor_parallel_size=2, max_model_len=256)
    runner = llm.engine.core.runner
    workers = [p.pid for p in runner.procs]
    assert llm.generate(["hi"], PARAMS)[0].outputs[0].token_ids
    os.kill(workers[0], signal.SIGKILL)
    with pytest.raises(TensorParallelError, match=rf"tensor-parallel rank 1 \(pid {workers[0]}\) was killed by "
                                                  r"signal 9 \(SIGKILL\)"):
        llm.generate(["hi there"], PARAMS)
    assert not wait_gone(workers, 10)
    assert not os.path.exists(runner.channel.path)


def test_close_stops_every_worker(checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    llm = LLM(model=str(model), backend="cpu", tensor_parallel_size=2, max_model_len=256)
    workers = [p.pid for p in llm.engine.core.runner.procs]
    assert alive(workers) == workers
    llm.engine.core.runner.close()
    assert not wait_gone(workers, 10)
    assert [p.returncode for p in llm.engine.core.runner.procs] == [0]


def test_a_size_that_does_not_divide_the_heads_fails_before_any_worker_starts(checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    before = set(descendants(os.getpid()))
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 3 does not divide the model's num_attention_heads"):
        LLM(model=str(model), backend="cpu", tensor_parallel_size=3, max_model_len=256)
    assert set(descendants(os.getpid())) <= before


def test_tp2_multi_step_decoding_gives_the_tokens_of_tp1(checkpoint_factory, monkeypatch):
    """--num-scheduler-steps 3 at TP=2: the core runs each schedule's steps one forward at a time, every rank
    taking part (ParallelRunner has no one-call path): the greedy tokens of TP=1 with one step a schedule."""
    from fd_core import SamplingParams
    from fd_core.engine.scheduler import Scheduler

    model = checkpoint_factory("tiny-dense", "pytorch")
    params = SamplingParams(max_tokens=10, temperature=0)
    steps: list[int] = []
    real = Scheduler.schedule
    monkeypatch.setattr(Scheduler, "schedule",
                        lambda self: (out := real(self), steps.extend(s.num_steps for s in out.scheduled))[0])

    def tokens(tp: int, **kwargs) -> list[list[int]]:
        llm = LLM(model=str(model), backend="cpu", tensor_parallel_size=tp, max_model_len=256, **kwargs)
        try:
            return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
        finally:
            if tp > 1:
                llm.engine.core.runner.close()

    want = tokens(1)
    assert tokens(2, num_scheduler_steps=3) == want
    assert 3 in steps
