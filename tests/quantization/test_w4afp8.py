"""w4afp8: wint4's weight layout with per-token dynamic e4m3 activations, against
numpy with an e4m3 encoder written from the format's definition; the method
end to end on tiny-moe, and its refusal by a backend that does not list it."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core import LLM, SamplingParams
from fd_core.errors import UnsupportedFeatureError
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization import dequantize, parse_quantization, quantize_weight
from fd_core.quantization.w4afp8 import quantize_activations_e4m3

from . import numpy_ref as ref
from .test_reference import check_moe_experts_against

GREEDY = dict(temperature=0, ignore_eos=True)


def e4m3_positive() -> np.ndarray:
    """float64 [127]: the finite non-negative e4m3fn values, codes 0..126 (sign 0,
    4 exponent bits with bias 7, 3 mantissa bits, subnormals at exponent 0)."""
    values = []
    for code in range(127):
        exponent, mantissa = code >> 3, code & 7
        values.append(mantissa / 8 * 2.0**-6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return np.array(values)


def numpy_e4m3(v: np.ndarray) -> np.ndarray:
    """Round each value (|v| <= 448) to the nearest e4m3 value, ties to the even code."""
    table = e4m3_positive()
    a = np.abs(v.astype(np.float64))
    hi = np.clip(np.searchsorted(table, a), 1, len(table) - 1)
    lo = hi - 1
    d_lo, d_hi = a - table[lo], table[hi] - a
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(v) * table[pick]


def numpy_w4afp8_linear(x: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Per token: e4m3 values of ``x / (max |x_t| / 448)``; per group: the dot product
    with the int4 codes (float64, exact here) times the group scale; then times the
    token scale."""
    x = x.astype(np.float32)
    amax = np.abs(x).max(axis=1)
    s = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    xq = numpy_e4m3(x / s[:, None])
    return ref.int4_groups_product(xq, packed, scales) * s.astype(np.float64)[:, None]


@pytest.fixture(scope="module")
def ops(cpu_backend):
    return cpu_backend.ops


def test_activation_codes_round_to_nearest_even():
    # token 0's max is 448, so its scale is 1 and these land on e4m3 grid midpoints exactly
    ties = np.array([448.0, 1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, -1.0625, 0.0, 300.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    x = np.stack([ties, rng.normal(0, 3, ties.size).astype(np.float32), np.zeros(ties.size, np.float32)])
    values, scales = quantize_activations_e4m3(paddle.to_tensor(x))
    np.testing.assert_array_equal(values.numpy()[0], [448.0, 1.0, 1.25, 0.0, 2.0**-8, -1.0, 0.0, 288.0])
    np.testing.assert_array_equal(scales.numpy(), [1.0, np.abs(x[1]).max() / np.float32(448), 1.0])
    np.testing.assert_array_equal(values.numpy()[1], numpy_e4m3(x[1] / scales.numpy()[1]))
    np.testing.assert_array_equal(values.numpy()[2], 0.0)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("group_size,tokens,d_in,d_out", [(128, 1, 256, 96), (32, 9, 96, 7), (128, 5, 38, 3),
                                                          (-1, 17, 64, 64)])
def test_linear_matches_numpy(ops, group_size, tokens, d_in, d_out, with_bias):
    rng = np.random.default_rng(tokens * d_in + d_out)
    x = rng.normal(0, 1, (tokens, d_in)).astype(np.float32)
    x[0, : d_in // 4] *= 30.0  # one part of a token far larger: its other inputs lose precision
    if tokens > 1:
        x[1] = 0.0  # a zero token: output exactly the bias
    w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
    b = rng.normal(0, 1, d_out).astype(np.float32) if with_bias else None
    q = quantize_weight("w4afp8", w, group_size)
    alone = quantize_weight("wint4", w, group_size)  # the same weight format as wint4
    np.testing.assert_array_equal(q.qweight.numpy(), alone.qweight.numpy())
    np.testing.assert_array_equal(q.scales.numpy(), alone.scales.numpy())
    assert (q.method, q.group_size) == ("w4afp8", alone.group_size)
    out = ops.linear(paddle.to_tensor(x), None, None if b is None else paddle.to_tensor(b), q)
    want = numpy_w4afp8_linear(x, q.qweight.numpy(), q.scales.numpy()) + (0.0 if b is None else b)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))
    if tokens > 1:
        np.testing.assert_array_equal(out.numpy()[1], 0.0 if b is None else b)
    np.testing.assert_allclose(dequantize(q).numpy(), dequantize(alone).numpy())
    # fp8 activations cost precision: close to the float product, not equal
    exact = x.astype(np.float64) @ w.astype(np.float64) + (0.0 if b is None else b)
    assert np.abs(out.numpy() - exact).max() < 0.25 * np.abs(exact).max()


def test_empty_batch(ops):
    q = quantize_weight("w4afp8", np.ones((64, 8), np.float32))
    assert list(ops.linear(paddle.zeros([0, 64]), None, None, q).shape) == [0, 8]


def test_moe_experts(ops):
    check_moe_experts_against(ops, "w4afp8", numpy_w4afp8_linear)


def test_flag_forms():
    plain = parse_quantization("w4afp8")
    assert (plain.dense_method, plain.moe_method, plain.group_size) == ("w4afp8", "w4afp8", 128)
    assert "group size 128" in plain.describe()
    split = parse_quantization({"quantization": "mix_quant", "dense_quant_type": "wint8",
                                "moe_quant_type": "w4afp8"}, "Ernie4_5_MoeForCausalLM")
    assert (split.dense_method, split.moe_method) == ("wint8", "w4afp8")
    assert split.methods(has_experts=True) == ("w4afp8", "wint8")
    with pytest.raises(ValueError, match="unknown key.*hadamard_block_size"):
        parse_quantization({"quantization": "mix_quant", "dense_quant_type": "wint8",
                            "moe_quant_type": "w4afp8", "hadamard_block_size": 512})


@pytest.mark.parametrize("quantization", ["w4afp8", {"quantization": "mix_quant", "dense_quant_type": "wint8",
                                                     "moe_quant_type": "w4afp8", "group_size": 32}], ids=str)
def test_greedy_run_on_tiny_moe(checkpoint_factory, quantization):
    llm = LLM(str(checkpoint_factory("tiny-moe", "paddle")), backend="cpu", quantization=quantization,
              max_model_len=128, num_gpu_blocks_override=32, block_size=16)
    runner = llm.engine.core.runner
    methods = {name: p.data.method for name, p in runner.model.parameters().items()
               if isinstance(p.data, QuantizedWeight)}
    experts = {m for name, m in methods.items() if ".experts." in name or name.endswith("experts")}
    assert experts == {"w4afp8"}, methods
    prompts = ["hello there", "the quick brown fox"]
    first = llm.generate(prompts, SamplingParams(max_tokens=6, **GREEDY), use_tqdm=False)
    again = llm.generate(prompts, SamplingParams(max_tokens=6, **GREEDY), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 6 for o in first)
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in again]


def test_x86_backend_refuses_by_name(checkpoint_factory):
    pytest.importorskip("fd_x86")
    with pytest.raises(UnsupportedFeatureError,
                       match=r"backend 'x86' cannot run w4afp8; its quantization methods: wint8, wint4, .*w4a8"):
        LLM(str(checkpoint_factory("tiny-moe", "paddle")), backend="x86", quantization="w4afp8",
            num_gpu_blocks_override=8)
