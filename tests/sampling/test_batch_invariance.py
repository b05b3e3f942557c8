"""Batch invariance of the sampler: given the same logits row, parameters and
seed, a request draws the same token, and takes the same early-stop decision,
alone, at any row of any batch and whatever its neighbours are -- for both
methods, with mixed temperature / top-k / top-p / min-p rows, ties, masked
tokens, and draws placed on a sampling boundary (where a rounding difference
of one ulp anywhere in the row's computation changes the token)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.sampling.early_stop import EarlyStopConfig
from fd_core.sampling.params import SamplingParams
from fd_core.sampling.sampler import NUM_UNIFORMS, Sampler, SamplingState, new_generator

V = 4096
ROWS = 40  # past the sizes where paddle's CPU row reductions change their blocking
METHODS = ["sort", "rejection"]


@pytest.fixture(scope="module")
def ops(cpu_backend):
    return cpu_backend.ops


def _random_params(rng: np.random.Generator) -> SamplingParams:
    return SamplingParams(
        temperature=float(rng.choice([0.0, 0.3, 0.7, 1.0, 1.0, 1.5])),
        top_k=int(rng.choice([0, 0, 1, 7, 50, 1000, V + 5])),
        top_p=float(rng.choice([1.0, 1.0, 0.95, 0.8, 0.3])),
        min_p=float(rng.choice([0.0, 0.0, 0.01, 0.2])),
        seed=int(rng.integers(2**62)),
    )


def _random_row(rng: np.random.Generator) -> np.ndarray:
    kind = rng.integers(4)
    row = rng.normal(0, float(rng.choice([0.5, 2.0, 8.0])), V)
    if kind == 1:
        row = np.round(row * 2) / 2  # many equal logits
    elif kind == 2:
        row[rng.random(V) < 0.5] = -np.inf  # banned / padding tokens
    return row.astype(np.float32)


def _boundary_case(rng: np.random.Generator) -> tuple[np.ndarray, SamplingParams]:
    """A row whose most likely token (token 0, first in both the sorted and
    the vocabulary order) has probability equal, to fp32 rounding, to the
    seed's first uniform: the draw sits on the first CDF step."""
    while True:
        seed = int(rng.integers(2**62))
        u0 = float(new_generator(seed).random(NUM_UNIFORMS, dtype=np.float32)[0])
        if 0.05 < u0 < 0.95:
            break
    rest = rng.normal(0, 0.3, V - 1)
    lead = np.log(u0 / (1 - u0)) + np.log(np.exp(rest).sum())
    row = np.concatenate(([lead], rest)).astype(np.float32)
    return row, SamplingParams(temperature=1.0, seed=seed)


def _cases(rng: np.random.Generator) -> tuple[np.ndarray, list[SamplingParams]]:
    rows, params = [], []
    for i in range(ROWS):
        if i % 3 == 0:
            row, prm = _boundary_case(rng)
        else:
            row, prm = _random_row(rng), _random_params(rng)
        rows.append(row)
        params.append(prm)
    return np.stack(rows), params


def _sample(ops, method: str, logits: np.ndarray, params: list[SamplingParams], **kw) -> tuple[list, list]:
    states = [SamplingState.create(p) for p in params]
    out = Sampler(ops, logits.shape[1], method, **kw).sample(paddle.to_tensor(logits), states)
    return out.sampled_token_ids, out.early_stopped


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("trial", range(3))
def test_a_row_draws_the_same_token_alone_and_in_any_batch(ops, method, trial):
    rng = np.random.default_rng([10, trial])
    logits, params = _cases(rng)
    batch, _ = _sample(ops, method, logits, params)
    alone = [_sample(ops, method, logits[i:i + 1], params[i:i + 1])[0][0] for i in range(ROWS)]
    assert batch == alone, [i for i in range(ROWS) if batch[i] != alone[i]]
    perm = rng.permutation(ROWS)
    shuffled, _ = _sample(ops, method, logits[perm], [params[i] for i in perm])
    assert shuffled == [batch[i] for i in perm]
    # other neighbours, other parameters: row 0 keeps its token
    others, other_params = _cases(rng)
    others[0], other_params[0] = logits[0], params[0]
    assert _sample(ops, method, others, other_params)[0][0] == batch[0]


def test_boundary_rows_do_sit_on_a_boundary(ops):
    """The boundary case is sharp: a one-ulp nudge of the lead logit, up or
    down, changes the token for some of the rows (else the test above would
    not be testing rounding)."""
    rng = np.random.default_rng(3)
    flips = 0
    for _ in range(20):
        row, prm = _boundary_case(rng)
        up, down = row.copy(), row.copy()
        up[0], down[0] = np.nextafter(row[0], np.float32(np.inf)), np.nextafter(row[0], np.float32(-np.inf))
        tokens = {_sample(ops, "sort", r[None], [prm])[0][0] for r in (down, row, up)}
        flips += len(tokens) > 1
    assert flips >= 5


def _crossing(ops, method: str, row: np.ndarray, prm: SamplingParams) -> tuple[float, float]:
    """Adjacent thresholds (lo, hi): this row alone is confident at lo, not at hi."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        confident = _sample(ops, method, row[None], [prm],
                            early_stop=EarlyStopConfig(window_size=1, threshold=mid))[1][0]
        lo, hi = (mid, hi) if confident else (lo, mid)
    return lo, hi


@pytest.mark.parametrize("method", METHODS)
def test_early_stop_decision_does_not_depend_on_the_batch(ops, method):
    """Each row's decision at its own crossing. On these near-flat rows
    paddle's logsumexp over [40, 2048] rounds a few rows (2-3 of 40) unlike
    the row alone, which flipped their decisions before the check went per row."""
    rng = np.random.default_rng(1)
    vocab = 2048
    logits = np.concatenate([rng.normal(0, 0.01, (ROWS // 2, vocab)),
                             np.abs(rng.normal(0, 1, (ROWS // 2, vocab))) / 100]).astype(np.float32)
    params = [_random_params(rng).replace(temperature=float(rng.choice([0.0, 1.0]))) for _ in range(ROWS)]
    for i in range(ROWS):
        lo, hi = _crossing(ops, method, logits[i], params[i])
        assert 0 < lo < hi < 1
        for threshold, want in ((lo, True), (hi, False)):
            stop = EarlyStopConfig(window_size=1, threshold=threshold)
            assert _sample(ops, method, logits, params, early_stop=stop)[1][i] is want, (i, threshold)
