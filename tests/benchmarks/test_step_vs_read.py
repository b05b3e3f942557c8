"""benchmarks/step_vs_read.py: the replay's shape and widths from a config, its bytes against the model's,
and the quantizations it does not replay refused by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks.test_llama_cpp import _load

script = _load("step_vs_read")

MOE = {"hidden_size": 256, "num_hidden_layers": 3, "moe_layer_start_index": 1, "intermediate_size": 512,
       "moe_intermediate_size": 128, "moe_num_experts": 8, "moe_k": 2, "moe_num_shared_experts": 1,
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000}


def test_shape_arguments_of_dense_and_moe_configs():
    assert script.shape_args(MOE, 0.5) == [str(v) for v in (256, 3, 1, 512, 128, 8, 2, 1, 4, 2, 64, 1000, 0.5)]
    dense = {k: v for k, v in MOE.items() if not k.startswith("moe_")} | {"head_dim": None}
    # no experts: every layer dense (FIRST_MOE = layers); head_dim from hidden / heads
    assert script.shape_args(dense, 1.0) == [str(v) for v in (256, 3, 3, 512, 0, 0, 0, 0, 4, 2, 64, 1000, 1.0)]
    listed = MOE | {"moe_num_experts": [8, 8], "moe_layer_start_index": [1, 1]}  # the VL model's lists
    assert script.shape_args(listed, 0.5) == script.shape_args(MOE, 0.5)
    assert script.shape_args(MOE | {"moe_layer_end_index": 2}, 0.5) == script.shape_args(MOE, 0.5)
    for other in ({"moe_layer_interval": 2}, {"moe_layer_end_index": 1}):  # MoE layers the replay would misplace
        with pytest.raises(ValueError, match="interval 1, end -1 or 2"):
            script.shape_args(MOE | other, 0.5)


def _avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_widths_of_each_quantization():
    assert script.widths("w4a8", "bfloat16") == (0.53125, 0.53125, 0.53125)
    assert script.widths("wint8", "float32") == (1.0, 1.0, 1.0)
    # FastDeploy's rule: experts int4, the other linears int8, the head float in the engine's weight dtype
    assert script.widths("wint4", "bfloat16") == (1.0, 0.53125, 2.0)
    assert script.widths("wint4", "float32")[2] == 4.0
    with pytest.raises(ValueError, match="'float8'"):
        script.widths("wint4", "float8")


@pytest.mark.skipif(shutil.which("g++") is None or not _avx512(), reason="needs g++ and an AVX-512 CPU")
def test_the_replay_reads_the_bytes_of_a_step(tmp_path):
    binary = script.build(tmp_path)
    d, a, kv, i, im, k, s, v = 256, 4 * 64, 2 * 64, 512, 128, 2, 1, 1000

    def step_mb(linear: float, expert: float, head: float) -> float:
        attention = d * (a + 2 * kv) * linear + a * d * linear
        dense = 3 * d * i * linear
        moe = d * 8 * 4 + k * 3 * d * im * expert + s * 3 * d * im * linear  # router (fp32), top-k, shared
        return (3 * attention + dense + 2 * moe + v * d * head) / 1e6

    ms, flat, mb = script.replay(binary, script.shape_args(MOE, 0.5), 2, 2, 4)
    assert mb == pytest.approx(step_mb(0.5, 0.5, 0.5), rel=0.01) and ms > 0 and flat > 0
    _, _, mb = script.replay(binary, script.shape_args(MOE, 1.0), 2, 2, 4, experts=0.53125, head=2.0)
    assert mb == pytest.approx(step_mb(1.0, 0.53125, 2.0), rel=0.01)
    bad = subprocess.run([str(binary), "1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
    zero = subprocess.run([str(binary), *script.shape_args(MOE, 0.5), "2", "1", "0"], capture_output=True, text=True)
    assert zero.returncode == 2 and "STEPS" in zero.stderr


def test_quantizations_it_does_not_replay_are_refused_by_name(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["step_vs_read.py", "--quantization", "mix_quant"])
    with pytest.raises(SystemExit):
        script.main()
    assert "'mix_quant'" in capsys.readouterr().err
