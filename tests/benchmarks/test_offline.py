"""fd-bench throughput and latency on a tiny generated checkpoint."""

from __future__ import annotations

import json

import pytest

from fd_core.benchmarks.cli import main

ENGINE = ["--backend", "cpu", "--max-model-len", "128", "--num-gpu-blocks-override", "64",
          "--block-size", "16", "--max-num-seqs", "4"]


@pytest.fixture(scope="module")
def model(checkpoint_factory) -> str:
    return str(checkpoint_factory("tiny-dense"))


def _run(tmp_path, *argv: str) -> dict:
    assert main([*argv, "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json"]) == 0
    return json.loads((tmp_path / "r.json").read_text())


def test_throughput_counts_every_token(tmp_path, model, capsys):
    result = _run(tmp_path, "throughput", "--model", model, *ENGINE, "--num-prompts", "6",
                  "--input-len", "10", "--output-len", "5", "--warmup-steps", "2", "--disable-tqdm")
    assert "Offline Throughput Result" in capsys.readouterr().out
    s = result["summary"]
    assert (s["num_requests"], s["total_input_tokens"], s["total_output_tokens"]) == (6, 60, 30)
    assert s["output_tokens_per_second"] == pytest.approx(30 / s["elapsed_time"])
    assert s["tokens_per_second"] == pytest.approx(90 / s["elapsed_time"])
    assert result["config"]["max_num_seqs"] == 4


def test_latency_splits_prefill_and_decode_steps(tmp_path, model, capsys):
    result = _run(tmp_path, "latency", "--model", model, *ENGINE, "--batch-size", "3",
                  "--input-len", "12", "--output-len", "4", "--num-iters", "2", "--warmup-steps", "1")
    assert "P99 decode step (ms)" in capsys.readouterr().out
    s = result["summary"]
    assert s["mean_prefill_steps"] == 1.0  # 3 x 12 prompt tokens fit one step
    assert s["num_decode_steps"] == 2 * 3  # the prefill step samples token 1; tokens 2..4 decode
    for it in result["iterations"]:
        steps = it["steps"]
        assert len(steps) == 4
        assert steps[0]["num_prefill_tokens"] == 36 and steps[0]["num_decodes"] == 0
        assert all(st["num_decodes"] == 3 and st["num_prefill_tokens"] == 0 for st in steps[1:])
        assert it["prefill"] == pytest.approx(steps[0]["wall"])
    wall = sum(st["wall"] for it in result["iterations"] for st in it["steps"][1:])
    assert s["decode_tokens_per_second"] == pytest.approx(18 / wall)
    assert s["p99_decode_step_ms"] >= s["median_decode_step_ms"]


def test_bad_flags_exit_2(model, capsys):
    assert main(["latency", "--model", model, *ENGINE, "--batch-size", "0"]) == 2
    assert "--batch-size must be >= 1" in capsys.readouterr().err


def test_dtype_flags_reach_the_engine(tmp_path, model, capsys):
    result = _run(tmp_path, "latency", "--model", model, *ENGINE, "--batch-size", "2", "--input-len", "8",
                  "--output-len", "2", "--num-iters", "1", "--dtype", "bfloat16", "--kv-cache-dtype", "int8")
    assert (result["config"]["dtype"], result["config"]["kv_cache_dtype"]) == ("bfloat16", "int8")
    assert main(["latency", "--model", model, *ENGINE, "--kv-cache-dtype", "int4"]) == 2
    assert "--kv-cache-dtype must be one of" in capsys.readouterr().err
