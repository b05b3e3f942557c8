"""MoE routing (moe_select_experts) and the routed experts' FFN (moe_experts)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from . import numpy_ref as ref


def _by_id(weights: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # the contract fixes which experts and their weights, not their order within a row
    order = np.argsort(ids, axis=-1)
    return np.take_along_axis(weights, order, -1), np.take_along_axis(ids, order, -1)


def _select(ops, logits, top_k, bias, renormalize, norm_min):
    w, ids = ops.moe_select_experts(paddle.to_tensor(logits), top_k,
                                    None if bias is None else paddle.to_tensor(bias),
                                    renormalize, norm_min)
    assert w.dtype == paddle.float32 and ids.dtype == paddle.int64
    return w.numpy(), ids.numpy()


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("seed,tokens,experts,top_k", [(0, 1, 4, 1), (1, 9, 8, 2), (2, 33, 64, 8),
                                                        (3, 5, 16, 4)])
def test_select_experts_matches_numpy(ops, renormalize, with_bias, seed, tokens, experts, top_k):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (tokens, experts)).astype(np.float32)
    bias = rng.normal(0, 0.05, experts).astype(np.float32) if with_bias else None
    w, ids = _select(ops, logits, top_k, bias, renormalize, 1e-12)
    want_w, want_ids = ref.moe_select_experts(logits, top_k, bias, renormalize, 1e-12)
    w, ids = _by_id(w, ids)
    want_w, want_ids = _by_id(want_w, want_ids)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=1e-5, atol=1e-7)


def test_bias_changes_selection_but_not_weights(ops):
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    bias = np.array([0.0, 0.0, 0.0, 0.6], dtype=np.float32)  # lifts expert 3 over expert 1
    w, ids = _select(ops, logits, 2, bias, False, 1e-12)
    w, ids = _by_id(w, ids)
    np.testing.assert_array_equal(ids, [[0, 3]])
    np.testing.assert_allclose(w, [[0.5, 0.05]], rtol=1e-5)  # probs, without the bias
    w, ids = _select(ops, logits, 2, bias, True, 1e-12)
    np.testing.assert_allclose(_by_id(w, ids)[0], [[0.5 / 0.55, 0.05 / 0.55]], rtol=1e-5)
    w, ids = _select(ops, logits, 2, None, False, 1e-12)
    np.testing.assert_array_equal(_by_id(w, ids)[1], [[0, 1]])


def test_renormalize_clamps_at_norm_min(ops):
    probs = np.array([[0.1, 0.1, 0.1, 0.7], [0.6, 0.3, 0.05, 0.05]], dtype=np.float32)
    w, ids = _select(ops, np.log(probs), 1, np.array([1.0, 0, 0, 0], np.float32), True, 0.5)
    w, ids = _by_id(w, ids)
    np.testing.assert_array_equal(ids, [[0], [0]])
    # row 0: 0.1 < norm_min -> 0.1 / 0.5; row 1: 0.6 >= norm_min -> 1
    np.testing.assert_allclose(w, [[0.2], [1.0]], rtol=1e-5)


def test_softmax_is_stable_for_large_logits(ops):
    logits = np.array([[1000.0, 999.0, -1000.0]], dtype=np.float32)
    w, ids = _select(ops, logits, 2, None, False, 1e-12)
    w, ids = _by_id(w, ids)
    np.testing.assert_array_equal(ids, [[0, 1]])
    np.testing.assert_allclose(w, [[1 / (1 + np.exp(-1)), 1 / (1 + np.e)]], rtol=1e-5)


def _uneven_ids(rng, tokens, experts, top_k):
    """Expert 1 takes (almost) every token, experts 0 and experts-1 none."""
    ids = np.zeros((tokens, top_k), dtype=np.int64)
    others = np.arange(2, experts - 1)
    for t in range(tokens):
        rest = rng.choice(others, size=top_k - 1, replace=False)
        first = 1 if t % 5 else int(rng.choice(others))
        if first in rest:
            rest[rest == first] = 1
        ids[t] = np.concatenate([[first], rest])[rng.permutation(top_k)]
    return ids


@pytest.mark.parametrize("seed,tokens,experts,top_k,dim,inter", [
    (0, 1, 4, 1, 8, 4), (1, 1, 8, 4, 16, 8), (2, 13, 8, 1, 16, 12), (3, 21, 8, 2, 32, 16),
    (4, 40, 10, 4, 24, 20),
])
def test_moe_experts_matches_numpy_with_uneven_loads(ops, seed, tokens, experts, top_k, dim, inter):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(tokens, dim)).astype(np.float32)
    up_gate = rng.normal(0, 0.3, (experts, dim, 2 * inter)).astype(np.float32)
    down = rng.normal(0, 0.3, (experts, inter, dim)).astype(np.float32)
    ids = _uneven_ids(rng, tokens, experts, top_k)
    weights = rng.uniform(0.05, 1, (tokens, top_k)).astype(np.float32)
    out = ops.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids),
                          paddle.to_tensor(up_gate), paddle.to_tensor(down))
    assert out.shape == [tokens, dim]
    np.testing.assert_allclose(out.numpy(), ref.moe_experts(x, weights, ids, up_gate, down),
                               rtol=1e-4, atol=1e-5)


def test_moe_experts_after_routing(ops):
    # the two ops chained, as a MoE layer does, against the numpy chain
    rng = np.random.default_rng(9)
    tokens, experts, dim, inter, top_k = 17, 6, 16, 8, 2
    x = rng.normal(size=(tokens, dim)).astype(np.float32)
    logits = rng.normal(size=(tokens, experts)).astype(np.float32)
    up_gate = rng.normal(0, 0.3, (experts, dim, 2 * inter)).astype(np.float32)
    down = rng.normal(0, 0.3, (experts, inter, dim)).astype(np.float32)
    w, ids = ops.moe_select_experts(paddle.to_tensor(logits), top_k, None, True, 1e-12)
    out = ops.moe_experts(paddle.to_tensor(x), w, ids, paddle.to_tensor(up_gate), paddle.to_tensor(down))
    want_w, want_ids = ref.moe_select_experts(logits, top_k, None, True, 1e-12)
    np.testing.assert_allclose(out.numpy(), ref.moe_experts(x, want_w, want_ids, up_gate, down),
                               rtol=1e-4, atol=1e-5)
