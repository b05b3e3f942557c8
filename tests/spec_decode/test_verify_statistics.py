"""Speculative sampling keeps the target's distribution, and this test notices when it does not.

The target is a Markov chain over a 5-token vocabulary (the logits of the next
token depend on the previous one), filtered by the request's temperature /
top-k / top-p as the sampler does. Each sample decodes two tokens after a
fixed context by rounds of draft -> verify (a round emits 1..k+1 tokens), with
a deterministic drafter (q one-hot) or a random model drafter (q a different
Markov chain the drafts are sampled from). The frequencies of the 25 possible
two-token outputs are compared with the exact target probabilities by
chi-square. Every generator is seeded, so each test is deterministic; the
threshold p > 1e-3 only says the seeds were not picked to hide a bias. The
same test with a deliberately broken acceptance rule or residual must fail
(p < 1e-6), so the test is known to detect what it guards.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fd_core.spec_decode import verify as verify_module
from fd_core.spec_decode.verify import verify
from tests.sampling.test_statistics import chi2_sf, kept_distribution

V, K, SAMPLES, LENGTH, START = 5, 2, 6000, 2, 0
TABLE = np.random.default_rng(11).normal(0, 1.2, (V, V)).astype(np.float32)  # previous token -> logits
DRAFT_TABLE = np.random.default_rng(12).dirichlet(np.ones(V), V)  # previous token -> q
PARAMS = {"plain": (1.0, 0, 1.0, 0.0), "filtered": (0.8, 3, 0.9, 0.0)}


def exact(params: tuple[float, int, float, float]) -> np.ndarray:
    """P(first two tokens) under the filtered target chain, [V, V]."""
    rows = np.stack([kept_distribution(TABLE[c], *params) for c in range(V)])
    return rows[START][:, None] * rows


def deterministic_drafts(last: int, rng: np.random.Generator) -> tuple[list[int], None]:
    return [(last + 1) % V, (last + 3) % V][:K], None


def random_drafts(last: int, rng: np.random.Generator) -> tuple[list[int], np.ndarray]:
    drafts, qs = [], []
    for _ in range(K):
        q = DRAFT_TABLE[last]
        last = int(rng.choice(V, p=q))
        drafts.append(last)
        qs.append(q)
    return drafts, np.stack(qs)


def speculative_counts(params: tuple[float, int, float, float],
                       drafter: Callable[[int, np.random.Generator], tuple[list[int], np.ndarray | None]]) -> np.ndarray:
    """Decode LENGTH tokens for SAMPLES requests in rounds of one batched verify each."""
    rng = np.random.default_rng(2024)
    outputs: list[list[int]] = [[] for _ in range(SAMPLES)]
    active = list(range(SAMPLES))
    while active:
        drafts: list[list[int]] = []
        qs: list[np.ndarray | None] = []
        rows: list[np.ndarray] = []
        for i in active:
            last = outputs[i][-1] if outputs[i] else START
            d, q = drafter(last, rng)
            drafts.append(d)
            qs.append(q)
            rows.extend(TABLE[t] for t in [last, *d])  # the target's row for each scored position
        n = len(active)
        t, k, p, m = (np.full(n, v) for v in params)
        result = verify(np.stack(rows), drafts, t, k.astype(np.int64), p, m, rng.random((len(rows), 16)), qs)
        for i, tokens in zip(active, result.token_ids):
            outputs[i].extend(tokens)
        active = [i for i in active if len(outputs[i]) < LENGTH]
    counts = np.zeros((V, V))
    for out in outputs:
        counts[out[0], out[1]] += 1
    return counts


def p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs.ravel() * counts.sum()
    observed = counts.ravel()
    assert observed[expected == 0].sum() == 0, "a token outside the target's support was emitted"
    keep = expected > 0
    chi2 = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return chi2_sf(chi2, int(keep.sum()) - 1)


DRAFTERS = {"deterministic": deterministic_drafts, "random_q": random_drafts}


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("case", PARAMS)
def test_speculative_sampling_has_the_target_distribution(case: str, drafter: str) -> None:
    params = PARAMS[case]
    assert p_value(speculative_counts(params, DRAFTERS[drafter]), exact(params)) > 1e-3


def _always_accept(p_x: float, q_x: float, u: float) -> bool:
    return True


def _ignore_q(p_x: float, q_x: float, u: float) -> bool:
    return u < p_x


def _resample_from_p(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    return p


BROKEN = {
    ("deterministic", "_accepts"): _always_accept,
    ("deterministic", "_residual"): _resample_from_p,
    ("random_q", "_accepts"): _ignore_q,
    ("random_q", "_residual"): _resample_from_p,
}


@pytest.mark.parametrize("drafter, name", list(BROKEN))
def test_a_broken_rule_is_detected(drafter: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, name, BROKEN[drafter, name])
    params = PARAMS["plain"]
    try:
        p = p_value(speculative_counts(params, DRAFTERS[drafter]), exact(params))
    except AssertionError:
        return  # emitted a token the target never would: detected too
    assert p < 1e-6
