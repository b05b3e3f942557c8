"""``--dtype``: what it resolves to, how weights are stored, and that fp32 stays as it was."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.engine.model_runner import ModelRunner
from fd_core.layers.param import Param, cast_host
from fd_core.model_loader.accounting import weight_bytes, weight_bytes_by_dtype
from fd_core.model_loader.dtypes import checkpoint_dtype, resolve_weight_dtype
from fd_core.model_loader.loader import CheckpointError, _place
from fd_core.models.ernie4_5 import Target
from fd_core.quantization import parse_quantization
from fd_core.testing.greedy import greedy_generate

PROMPTS = [[101, 202, 303], [400 + i for i in range(20)]]


@pytest.mark.parametrize("requested, stored, native, want", [
    ("auto", "bfloat16", False, "float32"),  # CPU backends: fp32 compute speed by default
    ("auto", "bfloat16", True, "bfloat16"),
    ("auto", "float16", True, "float16"),
    ("auto", "float32", True, "float32"),
    ("bfloat16", "float32", False, "bfloat16"),
    ("float16", "bfloat16", False, "float16"),
    ("float32", "bfloat16", True, "float32"),
])
def test_resolve_weight_dtype(requested, stored, native, want):
    assert resolve_weight_dtype(requested, stored, native) == want


def test_resolve_weight_dtype_refuses_unknown_names():
    with pytest.raises(ValueError, match="'half'"):
        resolve_weight_dtype("half", "float32", False)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_checkpoint_dtype_is_the_bulk_of_the_weights(checkpoint_factory, dtype):
    # the MoE checkpoint keeps its router fp32: the bulk still decides
    assert checkpoint_dtype(checkpoint_factory("tiny-moe", "pytorch", dtype=dtype)) == dtype


def test_cast_host_rounds_to_nearest_even_like_torch():
    torch = pytest.importorskip("torch")
    values = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 100
    values[:4] = [np.nan, np.inf, -np.inf, 0.0]
    for dtype, torch_dtype, bits in (("bfloat16", torch.bfloat16, torch.int16), ("float16", torch.float16, torch.int16)):
        got = cast_host(values, "float32", dtype)
        want = torch.tensor(values).to(torch_dtype).view(bits).numpy().view(np.uint16)
        assert np.isnan(cast_host(got, dtype, "float32")[0])
        np.testing.assert_array_equal(got.view(np.uint16)[1:], want[1:])
    bf16 = cast_host(values, "float32", "bfloat16")
    np.testing.assert_array_equal(cast_host(bf16, "bfloat16", "float32")[1:],
                                  torch.tensor(values).to(torch.bfloat16).float().numpy()[1:])


def test_fp16_overflow_is_refused_by_name():
    param = Param((2,), "float16")
    with pytest.raises(CheckpointError, match="'w'.*float16's range"):
        _place(Target(param, (2,)), "w", np.array([1.0, 1e6], np.float32), "float32")


def test_bf16_checkpoint_with_auto_or_float32_is_fp32_as_before(checkpoint_factory, cpu_backend):
    model_dir = checkpoint_factory("tiny-moe", "pytorch")  # bf16 on disk
    runs = {}
    for dtype in ("auto", "float32", "bfloat16"):
        runner = ModelRunner(model_dir, cpu_backend, num_blocks=16, block_size=16, dtype=dtype)
        runs[dtype] = (runner, greedy_generate(runner, PROMPTS, 6))
    auto = runs["auto"][0]
    assert auto.dtype == "float32"  # the cpu reference declares no native 16-bit compute
    assert auto.weight_bytes == weight_bytes(auto.model, as_fp32=True)
    assert runs["auto"][1] == runs["float32"][1]
    bf16 = runs["bfloat16"][0]
    by_dtype = weight_bytes_by_dtype(bf16.model)
    assert set(by_dtype) == {"bfloat16", "float32"}  # the router stays fp32
    assert by_dtype["float32"] < by_dtype["bfloat16"] / 50
    assert bf16.weight_bytes == sum(by_dtype.values()) < 0.51 * auto.weight_bytes + by_dtype["float32"]
    # the same rounded values, fp32 compute: the bf16 checkpoint gives the same tokens stored either way
    assert runs["bfloat16"][1][0] == runs["float32"][1][0]
    np.testing.assert_allclose(np.concatenate(runs["bfloat16"][1][1]), np.concatenate(runs["float32"][1][1]),
                               atol=1e-5)


@pytest.mark.parametrize("method", ["wint8", "wint4"])
def test_quantize_on_load_from_16_bit_weights(checkpoint_factory, cpu_backend, method):
    """wint* from a bf16 checkpoint: the quantized layers are the same, the
    rest (embeddings, norms, a tied LM head is quantized from the bf16 table)
    stored in bf16 holds the same values as fp32 would."""
    model_dir = checkpoint_factory("tiny-dense", "pytorch")
    quant = parse_quantization(method)
    outs = {}
    for dtype in ("float32", "bfloat16"):
        runner = ModelRunner(model_dir, cpu_backend, num_blocks=16, block_size=16, quantization=quant, dtype=dtype)
        outs[dtype] = greedy_generate(runner, PROMPTS, 6)
        if dtype == "bfloat16":
            stored = weight_bytes_by_dtype(runner.model)
            # (wint4 on ERNIE: wint8 dense layers, as FastDeploy; tiny-dense has no experts)
            assert set(stored) - {"bfloat16"} <= {"wint8", "wint4"} and len(stored) == 2
    assert outs["bfloat16"][0] == outs["float32"][0]
    np.testing.assert_allclose(np.concatenate(outs["bfloat16"][1]), np.concatenate(outs["float32"][1]), atol=1e-5)


def test_a_model_without_a_16_bit_forward_refuses_16_bit_weights_by_name(checkpoint_factory, cpu_backend,
                                                                         monkeypatch):
    from fd_core.config import UnsupportedFeatureError
    from fd_core.models.qwen3 import Qwen3ForCausalLM

    monkeypatch.delattr(Qwen3ForCausalLM, "weight_dtypes")  # as a model that declares none
    model_dir = checkpoint_factory("tiny-qwen3", "pytorch")
    with pytest.raises(UnsupportedFeatureError, match="--dtype bfloat16: Qwen3ForCausalLM"):
        ModelRunner(model_dir, cpu_backend, num_blocks=8, block_size=16, dtype="bfloat16")
    assert ModelRunner(model_dir, cpu_backend, num_blocks=8, block_size=16, dtype="auto").dtype == "float32"
