"""w4a8: wint4's weight layout with per-token int8 activations, against numpy
with exact integer group sums."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.quantization import dequantize, parse_quantization, quantize_weight

from . import numpy_ref as ref
from .test_reference import check_moe_experts_against


def numpy_w4a8_linear(x: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Per token: int8 codes; per group: an exact int64 dot product with the
    int4 codes times the group scale; then times the token scale (float64)."""
    x = x.astype(np.float32)
    s = ref.scales_of(x, 127)
    xq = np.clip(np.rint(x / s[:, None]), -127, 127).astype(np.int64)
    return ref.int4_groups_product(xq, packed, scales) * s.astype(np.float64)[:, None]


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
    check_moe_experts_against(ops, "w4a8", numpy_w4a8_linear)


def test_fastdeploy_split_in_mix_quant():
    config = parse_quantization({"quantization": "mix_quant", "dense_quant_type": "wint8",
                                 "moe_quant_type": "w4a8", "group_size": 64})
    assert (config.dense_method, config.moe_method, config.group_size) == ("wint8", "w4a8", 64)
