"""Sampled tokens follow the filtered, renormalised distribution.

Many draws go through the Sampler in one call (one row per draw, 20000 rows
of a 20-token vocabulary); frequencies are compared with the exact
distribution by chi-square. Every generator is seeded, so each test is
deterministic; the threshold p > 1e-3 only says the fixed seeds were not
chosen to hide a bias.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import paddle
import pytest

from fd_core.sampling.params import SamplingParams
from fd_core.sampling.sampler import Sampler, SamplingState

VOCAB, DRAWS = 20, 20000
P_MIN = 1e-3
LOGITS = np.random.default_rng(2024).normal(0, 1.5, VOCAB).astype(np.float32)

# name -> (temperature, top_k, top_p, min_p)
CASES = {
    "plain": (1.0, 0, 1.0, 0.0),
    "top_k": (1.0, 5, 1.0, 0.0),
    "top_p": (1.0, 0, 0.6, 0.0),
    "min_p": (1.0, 0, 1.0, 0.15),
    "combined": (0.8, 8, 0.8, 0.05),
    "cold": (0.5, 0, 1.0, 0.0),
    "hot": (2.0, 0, 1.0, 0.0),
    "top_k_1": (1.0, 1, 1.0, 0.0),
}


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df): the regularised upper incomplete gamma
    Q(df/2, x/2) (series below a+1, Lentz continued fraction above)."""
    a, x = df / 2.0, x / 2.0
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def kept_distribution(logits, temperature, top_k, top_p, min_p, margin=None):
    """The exact filtered, renormalised distribution (float64): min-p, then
    top-k, then top-p over the survivors (keeping the token that crosses).
    With ``margin``, assert no filter decision lies that close to its edge."""
    z = np.asarray(logits, np.float64) / temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    p = probs[order]
    rank = np.arange(len(p))
    keep = p >= min_p * p[0]
    if top_k > 0:
        keep &= rank < top_k
    mass = np.where(keep, p, 0) / np.where(keep, p, 0).sum()
    before = np.cumsum(mass) - mass
    if margin is not None:
        assert min_p == 0 or np.min(np.abs(p - min_p * p[0])) > margin * p[0]
        assert top_p == 1 or np.min(np.abs(before[keep] - top_p)) > margin
    keep &= (before < top_p) | (rank == 0)
    out = np.zeros_like(probs)
    out[order] = np.where(keep, p, 0)
    return out / out.sum()


@pytest.fixture(scope="module")
def ops(cpu_backend):
    return cpu_backend.ops


@functools.cache
def _counts(ops, method: str, case: str, seed: int = 0) -> np.ndarray:
    """Token counts of DRAWS rows of LOGITS sampled with CASES[case]."""
    t, k, p, m = CASES[case]
    params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
    generator = np.random.default_rng([seed, len(case), *map(ord, method + case)])
    # rows share one seeded generator: draws stay i.i.d. and creation is cheap
    states = [SamplingState(params, generator) for _ in range(DRAWS)]
    logits = paddle.to_tensor(np.tile(LOGITS, (DRAWS, 1)))
    tokens = Sampler(ops, VOCAB, method).sample(logits, states).sampled_token_ids
    return np.bincount(tokens, minlength=VOCAB)


def goodness_of_fit(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    support = expected_probs > 0
    expected = counts.sum() * expected_probs[support]
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    return chi2_sf(chi2, int(support.sum()) - 1)


def test_chi2_sf_reference_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(2.0, 2) == pytest.approx(math.exp(-1), rel=1e-12)
    assert chi2_sf(100.0, 3) < 1e-20 and chi2_sf(0.5, 30) > 0.999999


@pytest.mark.parametrize("method", ["sort", "rejection"])
@pytest.mark.parametrize("case", list(CASES))
def test_frequencies_match_the_filtered_distribution(ops, method, case):
    want = kept_distribution(LOGITS, *CASES[case], margin=1e-3)
    counts = _counts(ops, method, case)
    excluded = np.flatnonzero(want == 0)
    assert counts[excluded].sum() == 0, f"emitted excluded tokens {excluded[counts[excluded] > 0]}"
    if (want > 0).sum() > 1:
        p = goodness_of_fit(counts, want)
        assert p > P_MIN, f"{method} {case}: chi-square p = {p:.2e}"


def test_filters_actually_filter():
    kept = {case: int((kept_distribution(LOGITS, *prm) > 0).sum()) for case, prm in CASES.items()}
    assert kept["plain"] == kept["cold"] == kept["hot"] == VOCAB
    assert kept["top_k"] == 5 and kept["top_k_1"] == 1
    assert 1 < kept["top_p"] < VOCAB and 1 < kept["min_p"] < VOCAB
    assert 1 < kept["combined"] < min(8, kept["min_p"])


@pytest.mark.parametrize("case", ["plain", "top_p", "min_p", "combined", "hot"])
def test_rejection_matches_sort_in_distribution(ops, case):
    """Two-sample chi-square (2 x K contingency table) of the two methods."""
    table = np.stack([_counts(ops, "sort", case), _counts(ops, "rejection", case)]).astype(float)
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    chi2 = float(((table - expected) ** 2 / expected).sum())
    p = chi2_sf(chi2, table.shape[1] - 1)
    assert p > P_MIN, f"{case}: sort and rejection differ, p = {p:.2e}"


def test_temperature_reshapes_the_distribution(ops):
    plain = kept_distribution(LOGITS, 1.0, 0, 1.0, 0.0)
    cold, hot = _counts(ops, "sort", "cold"), _counts(ops, "sort", "hot")
    # each matches its own tempered softmax (above) and not the untempered one
    assert goodness_of_fit(cold, plain) < 1e-12 and goodness_of_fit(hot, plain) < 1e-12
    top = int(np.argmax(LOGITS))
    base = _counts(ops, "sort", "plain")
    assert cold[top] > base[top] > hot[top]
    entropy = [float(-(c / DRAWS * np.log(np.maximum(c, 1) / DRAWS)).sum()) for c in (cold, base, hot)]
    assert entropy[0] < entropy[1] < entropy[2]


def test_rejection_on_a_wide_flat_vocabulary_stays_in_the_top_k(ops):
    """Many rejection rounds (and some fallbacks): still only the top k, evenly."""
    vocab, draws, k = 500, 1000, 4
    rng = np.random.default_rng(8)
    logits = rng.normal(0, 0.01, vocab).astype(np.float32)
    top = np.argsort(-logits)[:k]
    logits[top] += 0.5  # the top k clearly apart from the crowd, even among themselves
    params = SamplingParams(top_k=k)
    generator = np.random.default_rng(9)
    states = [SamplingState(params, generator) for _ in range(draws)]
    out = Sampler(ops, vocab, "rejection").sample(paddle.to_tensor(np.tile(logits, (draws, 1))), states)
    counts = np.bincount(out.sampled_token_ids, minlength=vocab)
    assert set(np.flatnonzero(counts).tolist()) <= set(top.tolist())
    assert goodness_of_fit(counts, kept_distribution(logits, 1.0, k, 1.0, 0.0)) > P_MIN


@pytest.mark.parametrize("case", ["top_k", "top_p", "combined"])
def test_rejection_fallback_is_unbiased(ops, case):
    """With two uniform columns the op makes one rejection round and samples
    the rows it rejected by the sort fallback; the mixture must still be the
    filtered distribution (a fallback reusing the round's uniform is not)."""
    t, k, p, m = CASES[case]
    rng = np.random.default_rng(11)
    column = lambda value, dtype: paddle.to_tensor(np.full(DRAWS, value, dtype))  # noqa: E731
    tokens = ops.sample(
        paddle.to_tensor(np.tile(LOGITS, (DRAWS, 1))), column(t, np.float32),
        column(k, np.int64), column(p, np.float32), column(m, np.float32),
        paddle.to_tensor(rng.random((DRAWS, 2), dtype=np.float32)), "rejection",
    ).numpy()
    want = kept_distribution(LOGITS, t, k, p, m)
    counts = np.bincount(tokens, minlength=VOCAB)
    assert counts[want == 0].sum() == 0
    assert goodness_of_fit(counts, want) > P_MIN
