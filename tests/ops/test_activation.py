"""silu_and_mul: ``silu(gate) * up`` for ``x = [gate | up]``."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from . import numpy_ref as ref


@pytest.mark.parametrize("seed,tokens,inter", [(0, 1, 1), (1, 7, 16), (2, 33, 96), (3, 4, 352)])
def test_silu_and_mul_matches_numpy(ops, seed, tokens, inter):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 3, (tokens, 2 * inter)).astype(np.float32)
    out = ops.silu_and_mul(paddle.to_tensor(x))
    assert out.shape == [tokens, inter]
    np.testing.assert_allclose(out.numpy(), ref.silu_and_mul(x), rtol=1e-5, atol=1e-6)


def test_gate_is_the_first_half(ops):
    # gate = 0 -> silu(0) = 0 whatever up is; up = 0 -> 0 whatever gate is
    x = np.array([[0.0, 0.0, 5.0, -2.0], [3.0, -1.0, 0.0, 0.0]], dtype=np.float32)
    out = ops.silu_and_mul(paddle.to_tensor(x)).numpy()
    np.testing.assert_allclose(out, 0.0, atol=1e-7)
    x = np.array([[2.0, 1.0]], dtype=np.float32)
    np.testing.assert_allclose(ops.silu_and_mul(paddle.to_tensor(x)).numpy(), [[2.0 / (1 + np.exp(-2.0))]],
                               rtol=1e-6)


def test_odd_width_is_rejected(ops):
    with pytest.raises(ValueError, match="even"):
        ops.silu_and_mul(paddle.zeros([2, 5]))
