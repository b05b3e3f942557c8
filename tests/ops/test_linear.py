"""linear: ``x [T, in] @ W [in, out] + bias``; quantized weights not provided yet."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.backends import OpNotProvidedError
from fd_core.ops.linear import QuantizedWeight


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("seed,tokens,d_in,d_out", [(0, 1, 8, 3), (1, 9, 64, 48), (2, 31, 40, 128)])
def test_linear_matches_numpy(ops, with_bias, seed, tokens, d_in, d_out):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(tokens, d_in)).astype(np.float32)
    w = rng.normal(size=(d_in, d_out)).astype(np.float32)
    b = rng.normal(size=d_out).astype(np.float32) if with_bias else None
    out = ops.linear(paddle.to_tensor(x), paddle.to_tensor(w), None if b is None else paddle.to_tensor(b))
    want = x.astype(np.float64) @ w.astype(np.float64) + (0.0 if b is None else b)
    assert out.shape == [tokens, d_out]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


def test_weight_layout_is_in_by_out(ops):
    # a non-square weight: [out, in] would not even multiply
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    w = np.array([[1.0, 0.0, 3.0], [0.0, 1.0, -1.0]], dtype=np.float32)
    out = ops.linear(paddle.to_tensor(x), paddle.to_tensor(w)).numpy()
    np.testing.assert_allclose(out, [[1.0, 2.0, 1.0]])


@pytest.mark.parametrize("method", ["int3", "fp6"])
def test_quantized_weight_is_not_provided(ops, method):
    quant = QuantizedWeight(method=method, qweight=paddle.zeros([4, 4], dtype="int8"),
                            scales=paddle.ones([4]), in_features=4, out_features=4)
    with pytest.raises(OpNotProvidedError) as info:
        ops.linear(paddle.ones([2, 4]), None, None, quant)
    message = str(info.value)
    assert "linear" in message and method in message and "'cpu'" in message
