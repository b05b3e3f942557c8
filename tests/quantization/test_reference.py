"""Reference numerics of quantized linear and MoE layers against numpy."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.backends import OpNotProvidedError
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization import QuantizedParam, dequantize, expert_weight, quantize_weight
from fd_core.quantization.w8a8 import quantize_activations

from . import numpy_ref as ref


@pytest.fixture(scope="module")
def ops(cpu_backend):
    return cpu_backend.ops


def numpy_linear(x: np.ndarray, q: QuantizedWeight) -> np.ndarray:
    qweight, scales = q.qweight.numpy(), q.scales.numpy()
    if q.method == "w8a8":
        return ref.w8a8_linear(x, qweight, scales)
    w = ref.dequant_int4(qweight, scales) if q.method == "wint4" else ref.dequant_int8(qweight, scales)
    return x.astype(np.float64) @ w


CASES = [  # method, group_size, tokens, in, out
    ("wint8", 128, 1, 64, 96), ("wint8", 128, 9, 37, 5), ("wint8", 128, 31, 256, 130),
    ("wint4", 128, 1, 256, 96), ("wint4", 32, 9, 96, 7), ("wint4", 128, 5, 38, 3), ("wint4", -1, 17, 64, 64),
    ("w8a8", 128, 1, 64, 96), ("w8a8", 128, 9, 37, 5), ("w8a8", 128, 31, 512, 130),
]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("method,group_size,tokens,d_in,d_out", CASES)
def test_quantized_linear_matches_numpy(ops, method, group_size, tokens, d_in, d_out, with_bias):
    rng = np.random.default_rng(tokens * d_in + d_out)
    x = rng.normal(0, 1, (tokens, d_in)).astype(np.float32)
    w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
    w[:, 0] = 0.0  # a zero output channel
    if tokens > 1:
        x[1] = 0.0  # a zero token: w8a8's scale 1 path, output exactly the bias
    b = rng.normal(0, 1, d_out).astype(np.float32) if with_bias else None
    q = quantize_weight(method, w, group_size)
    out = ops.linear(paddle.to_tensor(x), None, None if b is None else paddle.to_tensor(b), q)
    want = numpy_linear(x, q) + (0.0 if b is None else b)
    assert out.shape == [tokens, d_out] and out.dtype == paddle.float32
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.numpy()[:, 0], 0.0 if b is None else b[0], atol=1e-6)
    if tokens > 1:
        np.testing.assert_allclose(out.numpy()[1], 0.0 if b is None else b, atol=1e-6)


def test_weight_only_methods_are_close_to_fp32(ops):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (16, 256)).astype(np.float32)
    w = rng.normal(0, 256**-0.5, (256, 128)).astype(np.float32)
    exact = x @ w
    errors = {}
    for method in ("wint8", "w8a8", "wint4"):
        out = ops.linear(paddle.to_tensor(x), None, None, quantize_weight(method, w)).numpy()
        errors[method] = np.abs(out - exact).mean() / np.abs(exact).mean()
    assert errors["wint8"] < 0.01 and errors["w8a8"] < 0.02 and errors["wint4"] < 0.15
    assert errors["wint8"] < errors["wint4"]


def test_w8a8_activation_rounding_is_half_to_even():
    x = paddle.to_tensor(np.array([[254.0, 1.0, 3.0, -1.0, 5.0]], dtype=np.float32))  # scale 2
    codes, scales = quantize_activations(x)
    np.testing.assert_array_equal(scales.numpy(), [2.0])
    np.testing.assert_array_equal(codes.numpy(), [[127, 0, 2, -0.0, 2]])  # 0.5 -> 0, 1.5 -> 2, 2.5 -> 2


def test_unknown_method_has_no_reference(ops):
    quant = QuantizedWeight("int3", paddle.zeros([4, 4], dtype="int8"), paddle.ones([4]), 4, 4)
    with pytest.raises(OpNotProvidedError, match="int3"):
        ops.linear(paddle.ones([2, 4]), None, None, quant)


# ------------------------------------------------------------------- MoE


def stacked(method: str, weights: np.ndarray, group_size: int) -> QuantizedWeight:
    """[E, in, out] -> a stacked QuantizedWeight, filled expert by expert in reverse
    order and in two column halves, as a loader may."""
    param = QuantizedParam(weights.shape, method, group_size, "experts")
    half = weights.shape[2] // 2
    for e in reversed(range(weights.shape[0])):
        param.fill(weights[e][:, half:], (e, slice(None), slice(half, None)))
        param.fill(weights[e][:, :half], (e, slice(None), slice(0, half)))
    assert param.complete
    param.finish()
    return param.data


def check_moe_experts_against(ops, method: str, numpy_linear) -> None:
    """``ops.moe_experts`` with ``method``'s experts (3 experts, top-2, group 32) against a
    numpy composition of ``numpy_linear(x, qweight, scales)`` per expert (silu-and-mul between)."""
    rng = np.random.default_rng(5)
    num_experts, hidden, inter, tokens = 3, 64, 32, 6
    up_gate = rng.normal(0, hidden**-0.5, (num_experts, hidden, 2 * inter)).astype(np.float32)
    down = rng.normal(0, inter**-0.5, (num_experts, inter, hidden)).astype(np.float32)
    quant = (stacked(method, up_gate, 32), stacked(method, down, 32))
    x = rng.normal(0, 1, (tokens, hidden)).astype(np.float32)
    ids = np.stack([np.arange(tokens) % 3, (np.arange(tokens) + 1) % 3], axis=1).astype(np.int64)
    weights = rng.uniform(0.1, 1, (tokens, 2)).astype(np.float32)
    out = ops.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids),
                          None, None, quant).numpy()
    want = np.zeros((tokens, hidden))
    for t in range(tokens):
        for k in range(2):
            e = int(ids[t, k])
            h = numpy_linear(x[t:t + 1], quant[0].qweight[e].numpy(), quant[0].scales[e].numpy())
            act = (h[:, :inter] / (1 + np.exp(-h[:, :inter])) * h[:, inter:]).astype(np.float32)
            want[t] += weights[t, k] * numpy_linear(act, quant[1].qweight[e].numpy(), quant[1].scales[e].numpy())[0]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method,group_size", [("wint8", 128), ("wint4", 32), ("wint4", -1), ("w8a8", 128)])
def test_moe_with_quantized_experts(ops, method, group_size):
    rng = np.random.default_rng(7)
    num_experts, hidden, inter, tokens, top_k = 6, 64, 32, 11, 2
    x = rng.normal(0, 1, (tokens, hidden)).astype(np.float32)
    up_gate = rng.normal(0, hidden**-0.5, (num_experts, hidden, 2 * inter)).astype(np.float32)
    down = rng.normal(0, inter**-0.5, (num_experts, inter, hidden)).astype(np.float32)
    ids = rng.choice([0, 2, 3, 5], size=(tokens, top_k))  # experts 1 and 4 get no tokens
    ids[:, 1] = np.where(ids[:, 1] == ids[:, 0], (ids[:, 0] + 2) % 6, ids[:, 1])
    weights = rng.uniform(0.1, 1, (tokens, top_k)).astype(np.float32)
    quant = (stacked(method, up_gate, group_size), stacked(method, down, group_size))
    assert quant[0].qweight.shape[0] == num_experts and quant[0].in_features == hidden
    for e in range(num_experts):  # the stack holds what quantize_weight makes of each expert
        alone = quantize_weight(method, up_gate[e], group_size)
        np.testing.assert_array_equal(expert_weight(quant[0], e).qweight.numpy(), alone.qweight.numpy())
        np.testing.assert_array_equal(expert_weight(quant[0], e).scales.numpy(), alone.scales.numpy())
    out = ops.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids.astype(np.int64)),
                          None, None, quant).numpy()
    want = np.zeros((tokens, hidden))
    for t in range(tokens):
        for k in range(top_k):
            e = int(ids[t, k])
            h = numpy_linear(x[t:t + 1], expert_weight(quant[0], e))
            gate, up = h[:, :inter], h[:, inter:]
            act = (gate / (1 + np.exp(-gate)) * up).astype(np.float32)
            want[t] += weights[t, k] * numpy_linear(act, expert_weight(quant[1], e))[0]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    if method != "w8a8":  # weight-only: the same as the fp32 MoE on the dequantized experts
        deq_up = paddle.stack([dequantize(expert_weight(quant[0], e)) for e in range(num_experts)])
        deq_down = paddle.stack([dequantize(expert_weight(quant[1], e)) for e in range(num_experts)])
        fp32 = ops.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights),
                               paddle.to_tensor(ids.astype(np.int64)), deq_up, deq_down, None).numpy()
        np.testing.assert_allclose(out, fp32, rtol=1e-5, atol=1e-5)
