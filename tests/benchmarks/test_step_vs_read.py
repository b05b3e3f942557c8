"""benchmarks/step_vs_read.py: the replay's shape from a config, its bytes against the model's, and the
quantizations it cannot replay refused by name."""

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


def _avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(shutil.which("g++") is None or not _avx512(), reason="needs g++ and an AVX-512 CPU")
def test_the_replay_reads_the_bytes_of_a_step(tmp_path):
    binary = script.build(tmp_path)
    ms, flat, mb = script.replay(binary, script.shape_args(MOE, 0.5), 2, 2, 4)
    d, a, kv, i, im, k, s, v = 256, 4 * 64, 2 * 64, 512, 128, 2, 1, 1000
    attention = d * (a + 2 * kv) * 0.5 + a * d * 0.5
    dense = 3 * d * i * 0.5
    moe = d * 8 * 4 + (k + s) * 3 * d * im * 0.5  # router (fp32), top-k and shared experts
    head = v * d * 0.5
    assert mb == pytest.approx((3 * attention + dense + 2 * moe + head) / 1e6, rel=0.01)
    assert ms > 0 and flat > 0
    bad = subprocess.run([str(binary), "1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_quantizations_it_cannot_replay_are_refused_by_name(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["step_vs_read.py", "--quantization", "wint4"])
    with pytest.raises(SystemExit):
        script.main()
    assert "--quantization 'wint4'" in capsys.readouterr().err
