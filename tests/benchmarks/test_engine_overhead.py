"""benchmarks/engine_overhead.py's --stub-kernels: the run op answers from its first call per shape."""

from __future__ import annotations

import types

import numpy as np

from tests.benchmarks.test_llama_cpp import _load

script = _load("engine_overhead")


def test_stubbed_run_answers_the_first_call_per_shape_and_restores_the_op():
    calls = []

    def run(hidden, *rest):
        calls.append(hidden.shape)
        return ("answer", len(calls))

    module = types.SimpleNamespace(fd_x86_run_plan_step=run)
    with script.StubbedRun(module) as stub:
        assert module.fd_x86_run_plan_step is stub
        first = module.fd_x86_run_plan_step(np.zeros((1, 4)), "x")
        assert module.fd_x86_run_plan_step(np.ones((1, 4)), "y") == first == ("answer", 1)
        assert module.fd_x86_run_plan_step(np.zeros((8, 4))) == ("answer", 2)  # another shape: the real op once
    assert calls == [(1, 4), (8, 4)]
    assert module.fd_x86_run_plan_step is run
