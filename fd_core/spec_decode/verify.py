"""Verification: which drafts the target accepts, and the token it adds.

Who calls: the engine core after the step's forward, with the target's
logits for every scored position (the runner's ``all_logits`` rows, after
the sampler's logits processors, penalties and masks were applied per
position), on the host, as numpy.

Layout: request i proposed ``drafts[i]`` (k_i >= 0 tokens) and owns k_i + 1
consecutive rows of ``logits [N, V]``: row j is the target's prediction for
the token after the context and ``drafts[i][:j]``, row k_i the bonus row.

- Greedy (temperature <= 0): accept the longest prefix where the draft equals
  the row's argmax (first maximum, as the sampler); then append the argmax of
  the first mismatching row, or of the bonus row. Token for token what
  decoding without speculation gives, for any drafter.
- Sampling: p is the target's distribution after temperature, min-p, top-k and
  top-p exactly as ``fd_core.ops.sampling`` draws (same float64 weights, same
  kept set). Draft x at row j is accepted when ``u < p(x) / q(x)``, i.e. with
  probability min(1, p(x)/q(x)); at the first rejection the token is drawn
  from normalise(max(0, p - q)); after k_i acceptances the bonus token is
  drawn from the bonus row's p. Deterministic drafters (n-gram, suffix) have
  q = one-hot(x): acceptance with probability p(x), the residual is p without
  x. This keeps the output distribution the target's (Leviathan et al. 2023,
  Chen et al. 2023); tests/spec_decode/test_verify_statistics.py checks it.

Uniforms: ``uniforms [N, U]`` (U >= 2), one row per scored position, drawn by
the engine from each request's seeded generator (the sampler's
``SamplingState.draw_uniforms``: the engine draws k_i + 1 rows per request
per step, whatever is accepted, so a seeded request's stream depends only on
its drafts). Column 0 drives the draws (inverse CDF in the sampler's order:
a request without drafts gets exactly the token the sampler's "sort" method
draws from the same row); column U-1 drives the acceptance tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fd_core.ops.sampling import HEAD, _descending, _draw_sorted, _row_weights

__all__ = ["VerifyResult", "target_probs", "verify", "verify_greedy"]


@dataclass
class VerifyResult:
    """One step's verification, request by request."""

    token_ids: list[list[int]]  # request -> accepted drafts then the target's token (1..k_i+1 tokens)
    num_accepted: list[int]  # request -> drafts accepted (len(token_ids[i]) - 1)

    @property
    def num_drafted(self) -> int:
        return sum(len(t) - 1 for t in self.token_ids)


def verify_greedy(logits: np.ndarray, drafts: Sequence[Sequence[int]]) -> VerifyResult:
    """Greedy verification of every request (see the module docstring)."""
    _check_rows(logits, drafts)
    best = np.asarray(logits).argmax(axis=-1).tolist()
    tokens, accepted, row = [], [], 0
    for draft in drafts:
        n = 0
        while n < len(draft) and int(draft[n]) == best[row + n]:
            n += 1
        tokens.append([int(t) for t in draft[:n]] + [best[row + n]])
        accepted.append(n)
        row += len(draft) + 1
    return VerifyResult(tokens, accepted)


def verify(
    logits: np.ndarray,
    drafts: Sequence[Sequence[int]],
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    min_p: np.ndarray,
    uniforms: np.ndarray,
    draft_probs: Sequence[np.ndarray | None] | None = None,
) -> VerifyResult:
    """Verify every request's drafts. ``temperature`` .. ``min_p``: ``[R]``, one
    per request (the sampler's meaning); ``uniforms [N, U]``; ``draft_probs``:
    per request None (a deterministic drafter: q one-hot) or ``[k_i, V]`` the
    drafter's probabilities at each draft position (a model drafter)."""
    logits = np.asarray(logits)
    _check_rows(logits, drafts)
    uniforms = np.asarray(uniforms, np.float64)
    if uniforms.ndim != 2 or uniforms.shape[0] != logits.shape[0] or uniforms.shape[1] < 2:
        raise ValueError(f"uniforms must be [{logits.shape[0]}, >=2], got {list(uniforms.shape)}")
    greedy = verify_greedy(logits, drafts)
    row = 0
    for i, draft in enumerate(drafts):
        k = len(draft)
        if temperature[i] > 0:
            q = None if draft_probs is None else draft_probs[i]
            if q is not None and np.shape(q) != (k, logits.shape[1]):
                raise ValueError(f"draft_probs of request {i} must be [{k}, {logits.shape[1]}], "
                                 f"got {list(np.shape(q))}")
            params = (float(temperature[i]), int(top_k[i]), float(top_p[i]), float(min_p[i]))
            out = _verify_sampled(logits[row: row + k + 1], draft, q, params, uniforms[row: row + k + 1])
            greedy.token_ids[i], greedy.num_accepted[i] = out, len(out) - 1
        row += k + 1
    return greedy


def target_probs(row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> np.ndarray | None:
    """The distribution ``fd_core.ops.sampling`` draws from for one row (float64,
    zero outside the kept set, summing to 1); None when the row has no finite
    maximum (the sampler then takes the argmax)."""
    w = _row_weights(row, temperature, min_p)
    if w is None:
        return None
    kept = _kept(w, top_k, top_p)
    return kept / kept.sum()


def _verify_sampled(rows: np.ndarray, draft: Sequence[int], q: np.ndarray | None,
                    params: tuple[float, int, float, float], u: np.ndarray) -> list[int]:
    temperature, top_k, top_p, min_p = params
    out: list[int] = []
    for j, x in enumerate(draft):
        p = target_probs(rows[j], temperature, top_k, top_p, min_p)
        if p is None:
            return out + [int(rows[j].argmax())]
        q_x = 1.0 if q is None else float(q[j][x])
        if _accepts(float(p[x]), q_x, float(u[j, -1])):
            out.append(int(x))
            continue
        residual = _residual(p, None if q is None else np.asarray(q[j], np.float64), int(x))
        if residual.sum() <= 0:  # p <= q everywhere: only by rounding; p itself is then right
            residual = p
        return out + [_draw_sorted(residual, 0, 1.0, float(u[j, 0]))]
    # every draft accepted: the bonus token, drawn exactly as the sampler draws
    w = _row_weights(rows[-1], temperature, min_p)
    if w is None:
        return out + [int(rows[-1].argmax())]
    return out + [_draw_sorted(w, top_k, top_p, float(u[-1, 0]))]


def _accepts(p_x: float, q_x: float, u: float) -> bool:
    """Accept with probability min(1, p(x) / q(x)) given u ~ U[0, 1)."""
    return u * q_x < p_x


def _residual(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    """max(0, p - q) (unnormalised); q None means one-hot at x: p without x."""
    if q is None:
        r = p.copy()
        r[x] = 0.0
        return r
    return np.maximum(p - q, 0.0)


def _kept(w: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """``w`` zeroed outside the top-k / top-p set, the set ``_draw_sorted`` draws from
    (top-k ties: the lowest ids; top-p keeps the token whose mass crosses)."""
    ids = np.flatnonzero(w)
    cw = w[ids]
    if 0 < top_k < ids.size:
        kth = np.partition(cw, ids.size - top_k)[ids.size - top_k]
        keep = cw > kth
        ties = np.flatnonzero(cw == kth)[: top_k - int(np.count_nonzero(keep))]
        keep[ties] = True
        ids, cw = ids[keep], cw[keep]
    if top_p < 1.0:
        ids = _top_p_ids(ids, cw, top_p)
    out = np.zeros_like(w)
    out[ids] = w[ids]
    return out


def _top_p_ids(ids: np.ndarray, cw: np.ndarray, top_p: float) -> np.ndarray:
    """The ids the top-p cut keeps (the token whose mass crosses included). Only
    the ``HEAD`` largest weights are sorted while their mass reaches the cut
    (ties at the smallest of them included, so they are a prefix of the whole
    row's order and the cumulative sums are the same numbers), as the
    sampler's ``_draw_sorted`` does: a 103k-token row costs a partition, not a
    sort."""
    cut_mass = top_p * float(cw.sum())
    head = HEAD
    while True:
        if head >= ids.size:
            part_ids, part = ids, cw
        else:
            smallest = np.partition(cw, ids.size - head)[ids.size - head]
            sel = cw >= smallest
            part_ids, part = ids[sel], cw[sel]
        order = _descending(part)
        cdf = np.cumsum(part[order])
        if head < ids.size and cdf[-1] < cut_mass:
            head *= 64  # the cut lies past the head
            continue
        before = np.concatenate(([0.0], cdf[:-1]))  # mass strictly ahead of each token
        n = max(int(np.searchsorted(before, cut_mass, side="left")), 1)
        return part_ids[order[:n]]


def _check_rows(logits: np.ndarray, drafts: Sequence[Sequence[int]]) -> None:
    rows = sum(len(d) + 1 for d in drafts)
    if np.ndim(logits) != 2 or np.shape(logits)[0] != rows:
        raise ValueError(f"logits must have one row per scored position ({rows} = drafts + 1 per request), "
                         f"got shape {list(np.shape(logits))}")
    vocab = np.shape(logits)[1]
    for i, d in enumerate(drafts):
        for t in d:
            if not 0 <= int(t) < vocab:
                raise ValueError(f"draft token {t} of request {i} is outside the vocabulary [0, {vocab})")
