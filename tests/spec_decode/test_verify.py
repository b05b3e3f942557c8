"""Verification: greedy prefix acceptance, and the sampled path's agreement with the sampler."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.ops.sampling import _host_sample
from fd_core.spec_decode.verify import target_probs, verify, verify_greedy

V = 8


def rows_with_argmax(best: list[int], vocab: int = V) -> np.ndarray:
    logits = np.random.default_rng(len(best)).normal(0, 1, (len(best), vocab)).astype(np.float32)
    for i, b in enumerate(best):
        logits[i, b] = 10.0
    return logits


def test_greedy_accepts_the_matching_prefix_then_the_target_token() -> None:
    # request 0: drafts [3, 4, 5], target argmax per row [3, 4, 6, 1] -> accept 2, then 6
    # request 1: no drafts -> the argmax of its one row
    # request 2: drafts [2, 2], target [2, 2, 7] -> all accepted plus the bonus 7
    # request 3: drafts [1], target [0, 5] -> none accepted, the target's 0
    logits = rows_with_argmax([3, 4, 6, 1, 4, 2, 2, 7, 0, 5])
    r = verify_greedy(logits, [[3, 4, 5], [], [2, 2], [1]])
    assert r.token_ids == [[3, 4, 6], [4], [2, 2, 7], [0]]
    assert r.num_accepted == [2, 0, 2, 0] and r.num_drafted == 4


def test_greedy_ties_take_the_first_maximum_like_the_sampler() -> None:
    logits = np.zeros((2, V), np.float32)
    assert verify_greedy(logits, [[0]]).token_ids == [[0, 0]]
    assert verify_greedy(logits, [[3]]).token_ids == [[0]]


def test_temperature_zero_rows_of_verify_are_greedy() -> None:
    logits = rows_with_argmax([3, 4, 6, 1])
    n = np.zeros(1)
    r = verify(logits, [[3, 4, 5]], n, n.astype(np.int64), np.ones(1), n, np.full((4, 2), 0.5))
    assert r.token_ids == [[3, 4, 6]]


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="one row per scored position"):
        verify_greedy(np.zeros((2, V)), [[1, 2]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        verify_greedy(np.zeros((2, V)), [[V]])
    with pytest.raises(ValueError, match="uniforms must be"):
        verify(np.zeros((1, V)), [[]], np.ones(1), np.zeros(1, np.int64), np.ones(1), np.zeros(1), np.zeros((1, 1)))


PARAMS = [(1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 0.6, 0.0), (1.0, 20, 0.8, 0.05), (0.9, 1, 1.0, 0.0)]


@pytest.mark.parametrize("params", PARAMS)
def test_without_drafts_the_token_is_the_sampler_token(params: tuple[float, int, float, float]) -> None:
    """A request with no drafts gets exactly what the sampler ("sort") draws from the same uniforms."""
    rng = np.random.default_rng(3)
    vocab, n = 300, 200
    logits = rng.normal(0, 2, (n, vocab)).astype(np.float32)
    logits[:, :10] = 1.0  # ties: equal weights order by token id
    uniforms = rng.random((n, 16), dtype=np.float32)
    t, k, p, m = (np.full(n, v) for v in params)
    expected = _host_sample(logits, t, k.astype(np.int64), p, m, uniforms, "sort")
    got = verify(logits, [[]] * n, t, k.astype(np.int64), p, m, uniforms)
    assert [x[0] for x in got.token_ids] == expected.tolist()


@pytest.mark.parametrize("params", PARAMS)
def test_target_probs_is_the_set_the_sampler_draws_from(params: tuple[float, int, float, float]) -> None:
    """Drawing by inverse CDF over target_probs (the sampler's order) gives the sampler's token."""
    from fd_core.ops.sampling import _draw_sorted

    rng = np.random.default_rng(4)
    t, k, p, m = params
    for _ in range(50):
        row = rng.normal(0, 2, 64).astype(np.float32)
        row[rng.integers(0, 64, 6)] = row.max()  # ties at the top
        probs = target_probs(row, t, k, p, m)
        assert probs is not None and abs(probs.sum() - 1) < 1e-12
        for u in rng.random(20):
            expected = _host_sample(row[None], np.array([t]), np.array([k]), np.array([p]), np.array([m]),
                                    np.array([[u]], np.float32), "sort")[0]
            assert _draw_sorted(probs, 0, 1.0, float(np.float32(u))) == expected


def test_a_draft_outside_the_kept_set_is_always_rejected() -> None:
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    logits = np.stack([row, row])
    one = np.ones(1)
    for u in np.linspace(0, 0.999, 50):
        uniforms = np.array([[0.3, u], [0.3, u]])
        r = verify(logits, [[3]], one, np.array([2]), one, np.zeros(1), uniforms)  # top_k 2 drops token 3
        assert r.num_accepted == [0] and r.token_ids[0][0] in (0, 1)


def test_a_certain_draft_is_always_accepted() -> None:
    logits = np.full((3, V), -30.0, np.float32)
    logits[0, 2] = logits[1, 5] = 10.0
    one = np.ones(1)
    r = verify(logits, [[2, 5]], one, np.zeros(1, np.int64), one, np.zeros(1), np.full((3, 2), 0.999))
    assert r.num_accepted == [2] and r.token_ids[0][:2] == [2, 5]


def test_model_drafter_q_equal_to_p_accepts_everything() -> None:
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 1, (3, V)).astype(np.float32)
    q = np.stack([target_probs(logits[j], 1.0, 0, 1.0, 0.0) for j in range(2)])  # type: ignore[misc]
    one = np.ones(1)
    for _ in range(20):
        r = verify(logits, [[1, 2]], one, np.zeros(1, np.int64), one, np.zeros(1),
                   rng.random((3, 16)), draft_probs=[q])
        assert r.num_accepted == [2]


def _full_sort_top_p(row: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """target_probs without top-k or min-p, by sorting the whole row (stable:
    equal weights in id order)."""
    z = row.astype(np.float64) / temperature
    w = np.exp(z - z.max())
    order = np.argsort(-w, kind="stable")
    before = np.concatenate(([0.0], np.cumsum(w[order])[:-1]))
    n = max(int(np.searchsorted(before, top_p * float(w.sum()), side="left")), 1)
    kept = np.zeros_like(w)
    kept[order[:n]] = w[order[:n]]
    return kept / kept.sum()


@pytest.mark.parametrize("scale,top_p", [(8.0, 0.8), (1.0, 0.9), (0.5, 0.999), (3.0, 0.1)])
def test_top_p_on_a_large_row_keeps_what_a_full_sort_keeps(scale: float, top_p: float) -> None:
    """The top-p cut sorts only the largest weights while their mass reaches the
    cut (growing the head otherwise: scale 0.5 / 0.999 needs the whole row);
    the kept set and the probabilities are those of a full sort, ties included."""
    rng = np.random.default_rng(int(scale * 10) + int(top_p * 1000))
    row = (np.round(rng.normal(0, scale, 103_424) * 4) / 4).astype(np.float32)  # many equal logits
    np.testing.assert_array_equal(target_probs(row, 1.0, 0, top_p, 0.0), _full_sort_top_p(row, 1.0, top_p))
