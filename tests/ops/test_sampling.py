"""sample: greedy rows, the sort method against a numpy inverse CDF, the
rejection method's support and distribution, and per-row independence."""

from __future__ import annotations

import math

import numpy as np
import paddle
import pytest

from fd_core.backends import OpNotProvidedError

from . import numpy_ref as ref

METHODS = ["sort", "rejection"]
ROUNDS = 16  # uniform columns given to the rejection method
# (temperature, top_k, top_p, min_p) rows that exercise each filter alone and together
PARAMS = [
    (1.0, 0, 1.0, 0.0), (0.7, 0, 0.9, 0.0), (1.3, 5, 1.0, 0.0), (1.0, 0, 1.0, 0.1),
    (1.0, 8, 0.6, 0.0), (0.5, 20, 0.8, 0.05), (2.0, 3, 0.5, 0.2), (1.0, 1, 1.0, 0.0),
    (1.0, 0, 0.2, 0.0), (1.1, 100, 0.95, 0.02),
]


def _call(ops, logits, params, uniforms, method):
    t, k, p, m = (np.array(col) for col in zip(*params))
    out = ops.sample(paddle.to_tensor(np.asarray(logits, np.float32)),
                     paddle.to_tensor(t.astype(np.float32)), paddle.to_tensor(k.astype(np.int64)),
                     paddle.to_tensor(p.astype(np.float32)), paddle.to_tensor(m.astype(np.float32)),
                     paddle.to_tensor(np.asarray(uniforms, np.float32)), method)
    assert out.dtype == paddle.int64 and out.shape == [len(params)]
    return out.numpy()


def _clear_of_edges(logits, params, u, gap=1e-4) -> bool:
    """True when no filter threshold or CDF step is within ``gap`` of deciding
    differently, so fp32 and float64 must agree exactly."""
    temperature, top_k, top_p, min_p = params
    probs = ref.softmax(np.asarray(logits, np.float64) / temperature)
    srt = np.sort(probs)[::-1]
    if min_p > 0 and np.min(np.abs(srt - min_p * srt[0])) < gap * srt[0]:
        return False
    tokens, kept = ref.kept_tokens(logits, temperature, top_k, top_p, min_p)
    # the top-p walk runs over the min-p/top-k survivors
    survivors = srt[srt >= min_p * srt[0]][: top_k or None]
    cum = np.cumsum(survivors / survivors.sum())
    if top_p < 1 and len(cum) > 1 and np.min(np.abs(cum[:-1] - top_p)) < gap:
        return False
    cdf = np.cumsum(kept / kept.sum())[:-1]
    return len(cdf) == 0 or np.min(np.abs(cdf - u)) > gap


def _random_rows(rng, params, vocab, scale=2.0):
    """Logits and one uniform per row, re-drawn until clear of fp32 edges."""
    logits, uniforms = [], []
    for prm in params:
        while True:
            row = rng.normal(0, scale, vocab)
            u = rng.uniform()
            if _clear_of_edges(row, prm, u):
                break
        logits.append(row)
        uniforms.append(u)
    return np.array(logits, np.float32), np.array(uniforms)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_rows_are_argmax(ops, method):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 50)).astype(np.float32)
    params = [(0.0, 3, 0.5, 0.1)] * 3 + [(0.0, 0, 1.0, 0.0)] * 3
    out = _call(ops, logits, params, rng.uniform(size=(6, ROUNDS)), method)
    np.testing.assert_array_equal(out, logits.argmax(-1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sort_matches_numpy_inverse_cdf(ops, seed):
    rng = np.random.default_rng(seed)
    params = PARAMS * 3
    logits, u = _random_rows(rng, params, vocab=64)
    uniforms = np.concatenate([u[:, None], rng.uniform(size=(len(u), 3))], axis=1)
    out = _call(ops, logits, params, uniforms, "sort")
    want = [ref.sample_row(row, *prm, ui) for row, prm, ui in zip(logits, params, u)]
    np.testing.assert_array_equal(out, want)


def test_sort_extreme_uniforms_pick_first_and_last_kept(ops):
    rng = np.random.default_rng(5)
    params = PARAMS
    logits, _ = _random_rows(rng, params, vocab=40)
    for u, pick in ((0.0, 0), (1.0 - 2.0**-24, -1)):
        out = _call(ops, logits, params, np.full((len(params), 1), u), "sort")
        want = [ref.kept_tokens(row, *prm)[0][pick] for row, prm in zip(logits, params)]
        np.testing.assert_array_equal(out, want, err_msg=f"u={u}")


@pytest.mark.parametrize("seed,params", [(0, [(0.0, 0, 1.0, 0.0), (1.0, 4, 0.7, 0.0)]),
                                         (1, [(1.0, 0, 0.9, 0.0), (0.0, 2, 0.5, 0.3), (0.8, 0, 1.0, 0.1)])])
def test_mixed_greedy_and_sampled_rows(ops, seed, params):
    rng = np.random.default_rng(seed)
    params = params * 4
    logits, u = _random_rows(rng, [(1.0, 0, 1.0, 0.0) if p[0] == 0 else p for p in params], vocab=32)
    out = _call(ops, logits, params, u[:, None], "sort")
    want = [ref.sample_row(row, *prm, ui) for row, prm, ui in zip(logits, params, u)]
    np.testing.assert_array_equal(out, want)
    out = _call(ops, logits, params, rng.uniform(size=(len(params), ROUNDS)), "rejection")
    for i, (row, prm) in enumerate(zip(logits, params)):
        if prm[0] == 0:
            assert out[i] == row.argmax()
        else:
            assert out[i] in ref.kept_tokens(row, *prm)[0]


@pytest.mark.parametrize("method", METHODS)
def test_filters_never_emit_excluded_tokens(ops, method):
    rng = np.random.default_rng(11)
    draws = 300
    logits = rng.normal(0, 2, (len(PARAMS), 48))
    logits[:, 40:] = -np.inf  # masked (e.g. vocabulary padding)
    rows = np.repeat(logits, draws, axis=0)
    params = [p for p in PARAMS for _ in range(draws)]
    uniforms = rng.uniform(size=(len(rows), ROUNDS))
    uniforms[::draws] = 0.0
    uniforms[draws - 1::draws] = 1.0 - 2.0**-24
    uniforms[draws - 2::draws] = 1.0  # a float64 draw just below 1 rounds up to 1.0 in fp32
    out = _call(ops, rows, params, uniforms, method)
    for i, prm in enumerate(PARAMS):
        allowed = set(ref.kept_tokens(logits[i], *prm)[0])
        emitted = set(out[i * draws:(i + 1) * draws].tolist())
        assert emitted <= allowed, f"params {prm}: emitted {sorted(emitted - allowed)} outside {sorted(allowed)}"


def _chi_square_limit(df: int, z: float = 4.265) -> float:
    # Wilson-Hilferty upper quantile (z = 4.265: p = 1e-5), no scipy needed
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("params", [(1.0, 0, 1.0, 0.0), (1.0, 0, 0.8, 0.0), (0.8, 5, 1.0, 0.0),
                                    (1.2, 6, 0.7, 0.05), (1.0, 0, 1.0, 0.15)])
def test_draws_follow_the_kept_distribution(ops, method, params):
    """Chi-square of many draws (rows of one call) against the exact kept distribution."""
    rng = np.random.default_rng(3)
    vocab, draws = 12, 6000
    logits = rng.normal(0, 1.2, vocab)
    tokens, probs = ref.kept_tokens(logits, *params)
    out = _call(ops, np.tile(logits, (draws, 1)), [params] * draws,
                rng.uniform(size=(draws, ROUNDS)), method)
    counts = np.bincount(out, minlength=vocab)
    assert counts[np.setdiff1d(np.arange(vocab), tokens)].sum() == 0
    expected = draws * probs / probs.sum()
    if len(tokens) > 1:
        chi2 = float(((counts[tokens] - expected) ** 2 / expected).sum())
        assert chi2 < _chi_square_limit(len(tokens) - 1), f"chi2={chi2:.1f} over {len(tokens)} tokens"


@pytest.mark.parametrize("method", METHODS)
def test_rows_are_independent(ops, method):
    """A row's token depends only on its own logits, params and uniforms."""
    rng = np.random.default_rng(21)
    n = len(PARAMS)
    logits = rng.normal(0, 2, (n, 30)).astype(np.float32)
    uniforms = rng.uniform(size=(n, ROUNDS))
    params = list(PARAMS)
    params[3] = (0.0, 0, 1.0, 0.0)  # a greedy neighbour
    batch = _call(ops, logits, params, uniforms, method)
    for i in range(n):
        alone = _call(ops, logits[i:i + 1], [params[i]], uniforms[i:i + 1], method)
        assert alone[0] == batch[i], f"row {i} changed when sampled alone"
    perm = rng.permutation(n)
    shuffled = _call(ops, logits[perm], [params[i] for i in perm], uniforms[perm], method)
    np.testing.assert_array_equal(shuffled, batch[perm])
    # other rows' data changing leaves row 0 alone
    other = rng.normal(0, 5, (n, 30)).astype(np.float32)
    other[0] = logits[0]
    other_u = rng.uniform(size=(n, ROUNDS))
    other_u[0] = uniforms[0]
    assert _call(ops, other, [params[0]] + [(0.3, 2, 0.3, 0.3)] * (n - 1), other_u, method)[0] == batch[0]


def test_sort_uses_only_the_first_uniform(ops):
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(5, 20))
    params = PARAMS[:5]
    u = rng.uniform(size=(5, 1))
    a = _call(ops, logits, params, np.concatenate([u, rng.uniform(size=(5, 3))], 1), "sort")
    b = _call(ops, logits, params, np.concatenate([u, rng.uniform(size=(5, 3))], 1), "sort")
    np.testing.assert_array_equal(a, b)


def test_unknown_method_is_not_provided(ops):
    with pytest.raises(OpNotProvidedError, match="bogus"):
        _call(ops, np.zeros((1, 4)), [(1.0, 0, 1.0, 0.0)], np.zeros((1, 1)), "bogus")
