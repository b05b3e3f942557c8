"""w4a8: wint4's weight layout with per-token int8 activations, against numpy
with exact integer group sums."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.quantization import dequantize, parse_quantization, quantize_weight

from . import numpy_ref as ref
from .test_reference import stacked


def numpy_w4a8_linear(x: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Per token: int8 codes; per group: an exact int64 dot product with the
    int4 codes times the group scale; then times the token scale (float64)."""
    x = x.astype(np.float32)
    s = ref.scales_of(x, 127)
    xq = np.clip(np.rint(x / s[:, None]), -127, 127).astype(np.int64)
    codes = ref.unpack_int4(packed)  # [out, in]
    groups = scales.shape[1]
    per = codes.shape[1] // groups
    y = np.zeros((x.shape[0], codes.shape[0]))
    for g in range(groups):
        cols = slice(g * per, (g + 1) * per)
        y += (xq[:, cols] @ codes[:, cols].T) * scales[:, g].astype(np.float64)[None, :]
    return y * s.astype(np.float64)[:, None]


@pytest.fixture(scope="module")
def ops(cpu_backend):
    return cpu_backend.ops


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("group_size,tokens,d_in,d_out", [(128, 1, 256, 96), (32, 9, 96, 7), (128, 5, 38, 3),
                                                          (-1, 17, 64, 64)])
def test_linear_matches_numpy(ops, group_size, tokens, d_in, d_out, with_bias):
    rng = np.random.default_rng(tokens * d_in + d_out)
    x = rng.normal(0, 1, (tokens, d_in)).astype(np.float32)
    if tokens > 1:
        x[1] = 0.0  # a zero token: scale 1, output exactly the bias
    w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
    b = rng.normal(0, 1, d_out).astype(np.float32) if with_bias else None
    q = quantize_weight("w4a8", w, group_size)
    alone = quantize_weight("wint4", w, group_size)  # the same weight format as wint4
    np.testing.assert_array_equal(q.qweight.numpy(), alone.qweight.numpy())
    np.testing.assert_array_equal(q.scales.numpy(), alone.scales.numpy())
    assert q.group_size == alone.group_size
    out = ops.linear(paddle.to_tensor(x), None, None if b is None else paddle.to_tensor(b), q)
    want = numpy_w4a8_linear(x, q.qweight.numpy(), q.scales.numpy()) + (0.0 if b is None else b)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))
    if tokens > 1:
        np.testing.assert_array_equal(out.numpy()[1], 0.0 if b is None else b)
    np.testing.assert_allclose(dequantize(q).numpy(), dequantize(alone).numpy())


def test_moe_experts(ops):
    rng = np.random.default_rng(5)
    num_experts, hidden, inter, tokens = 3, 64, 32, 6
    up_gate = rng.normal(0, hidden**-0.5, (num_experts, hidden, 2 * inter)).astype(np.float32)
    down = rng.normal(0, inter**-0.5, (num_experts, inter, hidden)).astype(np.float32)
    quant = (stacked("w4a8", up_gate, 32), stacked("w4a8", down, 32))
    x = rng.normal(0, 1, (tokens, hidden)).astype(np.float32)
    ids = np.stack([np.arange(tokens) % 3, (np.arange(tokens) + 1) % 3], axis=1).astype(np.int64)
    weights = rng.uniform(0.1, 1, (tokens, 2)).astype(np.float32)
    out = ops.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids),
                          None, None, quant).numpy()
    want = np.zeros((tokens, hidden))
    for t in range(tokens):
        for k in range(2):
            e = int(ids[t, k])
            h = numpy_w4a8_linear(x[t:t + 1], quant[0].qweight[e].numpy(), quant[0].scales[e].numpy())
            act = (h[:, :inter] / (1 + np.exp(-h[:, :inter])) * h[:, inter:]).astype(np.float32)
            want[t] += weights[t, k] * numpy_w4a8_linear(act, quant[1].qweight[e].numpy(),
                                                         quant[1].scales[e].numpy())[0]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_fastdeploy_split_in_mix_quant():
    config = parse_quantization({"quantization": "mix_quant", "dense_quant_type": "wint8",
                                 "moe_quant_type": "w4a8", "group_size": 64})
    assert (config.dense_method, config.moe_method, config.group_size) == ("wint8", "w4a8", 64)
