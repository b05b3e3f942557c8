"""benchmarks/multi_step.py and the llama.cpp script's token count: a block runs the step count it names, and
measure_decode counts the tokens the timed steps made (several a step with multi-step decoding)."""

from __future__ import annotations

import argparse

import pytest

from tests.benchmarks.test_llama_cpp import _load

script = _load("multi_step")
fdc = _load("llama_cpp_fdcore")


def test_blocks_run_the_step_count_they_name_and_compare_pairs_them(checkpoint_factory, monkeypatch):
    from fd_core import LLM
    from fd_core.engine.scheduler import Scheduler

    llm = LLM(str(checkpoint_factory("tiny-dense", "pytorch")), backend="cpu", max_model_len=128,
              num_scheduler_steps=4, enable_prefix_caching=False)
    seen: list[int] = []
    real = Scheduler.schedule
    monkeypatch.setattr(Scheduler, "schedule",
                        lambda self: (out := real(self), seen.extend(s.num_steps for s in out.scheduled))[0])
    assert script.block(llm, 4, 1, 8, 9, 0) > 0
    assert max(seen) == 4
    seen.clear()
    script.block(llm, 1, 2, 8, 5, 1)
    assert set(seen) == {1}
    result = script.compare(llm, 1, 3, argparse.Namespace(batch=1, prompt_len=8, tokens=6, pairs=2))
    assert set(result) == {"a", "b", "ratio", "p25", "p75"} and result["ratio"] > 0 and 3 in seen


def test_measure_decode_counts_the_tokens_of_multi_step_schedules(checkpoint_factory, monkeypatch):
    row = fdc.load("tiny", checkpoint_factory("tiny-dense", "pytorch"), "cpu", {"num_scheduler_steps": 3}, 2, 256)

    def timed_steps(config, batch, steps):  # each engine step takes one second
        for _ in range(steps):
            config.llm.engine.step()
        config.steps.setdefault(batch, []).extend([1.0] * steps)

    monkeypatch.setattr(fdc, "timed_steps", timed_steps)
    fdc.measure_decode(row, [2], 8, 4)
    assert row.decode[2] == [2 * 4 * 3 / 4]  # 2 requests x 4 steps x 3 tokens a step, over 4 seconds


def test_sampled_blocks_draw_with_the_given_settings(checkpoint_factory, monkeypatch):
    """--temperature / --top-p / --top-k: the timed requests are seeded sampled ones, and they multi-step."""
    from fd_core import LLM
    from fd_core.engine.core import EngineCore

    llm = LLM(str(checkpoint_factory("tiny-dense", "pytorch")), backend="cpu", max_model_len=128,
              num_scheduler_steps=4, enable_prefix_caching=False)
    args = argparse.Namespace(temperature=0.8, top_p=0.8, top_k=5)
    sampling = script.sampling_args(args)
    assert sampling == {"temperature": 0.8, "top_p": 0.8, "top_k": 5}
    assert script.sampling_args(argparse.Namespace(temperature=0.0, top_p=1.0, top_k=0)) is None
    seen = []
    real = EngineCore.add_request
    monkeypatch.setattr(EngineCore, "add_request", lambda self, req: (seen.append(req.sampling_params), real(self, req)))
    assert script.block(llm, 4, 1, 8, 9, 3, sampling) > 0
    assert [(p.temperature, p.top_p, p.top_k, p.seed) for p in seen] == [(0.8, 0.8, 5, 3)]


def test_the_flags_refuse_a_draw_setting_without_a_temperature_and_equal_step_counts(monkeypatch, capsys):
    for argv, said in ((["--top-p", "0.8"], "--top-p 0.8 / --top-k 0 need --temperature above 0"),
                       (["--top-k", "5"], "--top-k 5 need --temperature above 0"),
                       (["--steps", "4", "4"], "--steps compares two different step counts, got 4 twice")):
        monkeypatch.setattr("sys.argv", ["multi_step.py", *argv])
        with pytest.raises(SystemExit):
            script.main()
        assert said in capsys.readouterr().err


def test_the_sampling_benchmark_times_both_draws():
    bench = _load("sampling")
    result = bench.time_op(3000, 3.0, bench.SETTINGS[0], repeats=3)
    assert set(result) == {"native_ms", "reference_ms", "ratio", "same", "draws"}
    assert result["draws"] == 3 and result["same"] == 3 and result["native_ms"] > 0
