"""rms_norm: ``x / sqrt(mean(x^2) + eps) * weight``, optionally fused with the residual add."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from . import numpy_ref as ref

CASES = [(0, 1, 8, 1e-6), (1, 5, 64, 1e-5), (2, 17, 96, 1e-2), (3, 3, 32, 1.0)]


@pytest.mark.parametrize("seed,tokens,hidden,eps", CASES)
def test_rms_norm_matches_numpy(ops, seed, tokens, hidden, eps):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 0.5, (tokens, hidden)).astype(np.float32)
    w = rng.normal(1, 0.2, hidden).astype(np.float32)
    out = ops.rms_norm(paddle.to_tensor(x), paddle.to_tensor(w), eps)
    np.testing.assert_allclose(out.numpy(), ref.rms_norm(x, w, eps), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed,tokens,hidden,eps", CASES)
def test_rms_norm_with_residual_returns_normed_and_sum(ops, seed, tokens, hidden, eps):
    rng = np.random.default_rng(100 + seed)
    x = rng.normal(0, 0.5, (tokens, hidden)).astype(np.float32)
    res = rng.normal(0, 2.0, (tokens, hidden)).astype(np.float32)
    w = rng.normal(1, 0.2, hidden).astype(np.float32)
    normed, summed = ops.rms_norm(paddle.to_tensor(x), paddle.to_tensor(w), eps, paddle.to_tensor(res))
    want_normed, want_sum = ref.rms_norm(x, w, eps, res)
    np.testing.assert_allclose(normed.numpy(), want_normed, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(summed.numpy(), want_sum, rtol=1e-6, atol=1e-6)


def test_rms_norm_eps_is_inside_the_root(ops):
    # small activations: eps dominates, so putting it elsewhere (or dropping it) shows
    x = np.full((2, 4), 0.01, dtype=np.float32)
    w = np.ones(4, dtype=np.float32)
    out = ops.rms_norm(paddle.to_tensor(x), paddle.to_tensor(w), 1e-2).numpy()
    np.testing.assert_allclose(out, 0.01 / np.sqrt(1e-4 + 1e-2), rtol=1e-5)
