"""Drawing tokens from logits: temperature, min-p, top-k, top-p.

The filters apply in this order, each to what the previous left:
``probs = softmax(logits / T)``; min-p drops tokens with
``p < min_p * max(p)``; top-k keeps the k most likely; top-p keeps the
smallest most-likely set whose renormalised mass reaches ``top_p`` (the
token that crosses it is kept). The draw is the inverse CDF of the kept,
renormalised distribution at ``u`` (sorted by probability, descending;
equal probabilities in token-id order).

Batch invariance: on CPU tensors the draw is computed row by row in numpy,
in float64 and in a fixed order (``_host_sample``), so a row's token is a
function of that row's logits, parameters and uniforms alone, whatever the
other rows of the batch. Paddle's CPU kernels make no such promise (its
``logsumexp`` over ``[B, V]``, for one, rounds some rows unlike the row alone).
Other devices run the paddle form below, whose per-row results are the
device kernels' business.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops._host import as_array, on_host

__all__ = ["reference_sample", "filtered_probs"]

paddle = import_paddle()
F = paddle.nn.functional

# "sort" on CPU sorts only the HEAD most likely tokens first, and all of
# them only when the draw or the top-p cut lies beyond that head
HEAD = 1024


def _temperature_probs(logits: Any, temperature: Any) -> Any:
    t = paddle.where(temperature > 0, temperature, paddle.ones_like(temperature))
    return F.softmax(logits / t.unsqueeze(-1), axis=-1)


def filtered_probs(probs: Any, top_k: Any, top_p: Any, min_p: Any) -> tuple[Any, Any]:
    """Sort ``probs [B, V]`` descending and zero what the filters drop.

    Returns ``(kept [B, V] in sorted order, sorted token ids [B, V])``.
    """
    sorted_ids = paddle.argsort(probs, axis=-1, descending=True)
    sorted_probs = paddle.take_along_axis(probs, sorted_ids, axis=-1)  # one sort, not two
    vocab = probs.shape[-1]
    rank = paddle.arange(vocab, dtype="int64").unsqueeze(0)
    keep = sorted_probs >= (min_p * sorted_probs[:, :1].squeeze(-1)).unsqueeze(-1)
    k = paddle.where(top_k > 0, top_k, paddle.full_like(top_k, vocab))
    keep = keep & (rank < k.unsqueeze(-1))
    kept = paddle.where(keep, sorted_probs, paddle.zeros_like(sorted_probs))
    mass = kept / kept.sum(axis=-1, keepdim=True)
    before = paddle.cumsum(mass, axis=-1) - mass  # mass strictly ahead of each token
    keep = keep & ((before < top_p.unsqueeze(-1)) | (rank == 0))
    return paddle.where(keep, sorted_probs, paddle.zeros_like(sorted_probs)), sorted_ids


def _inverse_cdf(weights: Any, u: Any) -> Any:
    # weights: [B, V] >= 0 (not normalised); u: [B] -> index [B]
    cdf = paddle.cumsum(weights, axis=-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    index = (cdf <= target).astype("int64").sum(axis=-1)
    # never land on a zero-weight tail token because of rounding
    last_nonzero = (weights > 0).astype("int64").cumsum(axis=-1).argmax(axis=-1)
    return paddle.minimum(index, last_nonzero)


def _sample_sorted(probs: Any, top_k: Any, top_p: Any, min_p: Any, u: Any) -> Any:
    kept, sorted_ids = filtered_probs(probs, top_k, top_p, min_p)
    index = _inverse_cdf(kept, u)
    return paddle.take_along_axis(sorted_ids, index.unsqueeze(-1), axis=-1).squeeze(-1)


def _sample_rejection(probs: Any, top_k: Any, top_p: Any, min_p: Any, uniforms: Any) -> Any:
    """Rejection sampling with a rising pivot: draw from ``probs > pivot``
    in vocabulary order (no sort); accept if the token is inside the
    top-k/top-p set, else raise the pivot to its probability and redraw.

    Rounds use ``uniforms[:, :-1]``; a row still unaccepted after them falls
    back to the sort method with the last column, which no round has looked
    at (reusing a round's uniform would bias the fallback towards the
    tokens that round rejected). With one column, this is the sort method."""
    vocab = probs.shape[-1]
    pmax = probs.max(axis=-1, keepdim=True)
    probs = paddle.where(probs >= min_p.unsqueeze(-1) * pmax, probs, paddle.zeros_like(probs))
    k = paddle.where(top_k > 0, top_k, paddle.full_like(top_k, vocab))
    kmax = int(min(int(k.max()), vocab))
    top_vals, _ = paddle.topk(probs, k=kmax, axis=-1)  # partial selection for the top-k mass
    in_topk = paddle.arange(kmax, dtype="int64").unsqueeze(0) < k.unsqueeze(-1)
    total = paddle.where(in_topk, top_vals, paddle.zeros_like(top_vals)).sum(axis=-1)
    pivot = paddle.zeros_like(pmax.squeeze(-1))
    result = paddle.full_like(k, -1)
    for r in range(uniforms.shape[1] - 1):
        candidates = paddle.where(probs > pivot.unsqueeze(-1), probs, paddle.zeros_like(probs))
        token = _inverse_cdf(candidates, uniforms[:, r])
        p = paddle.take_along_axis(probs, token.unsqueeze(-1), axis=-1)  # [B, 1]
        above = probs > p
        rank = above.astype("int64").sum(axis=-1)
        mass_above = paddle.where(above, probs, paddle.zeros_like(probs)).sum(axis=-1)
        ok = (rank < k) & ((mass_above < top_p * total) | (rank == 0))
        result = paddle.where((result < 0) & ok, token, result)
        if bool((result >= 0).all()):
            return result
        pivot = paddle.where(result < 0, p.squeeze(-1), pivot)
    fallback = _sample_sorted(probs, top_k, top_p, paddle.zeros_like(min_p), uniforms[:, -1])
    return paddle.where(result >= 0, result, fallback)


def reference_sample(
    logits: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    min_p: Any,
    uniforms: Any,
    method: str = "sort",
) -> Any:
    """One token per row; rows with ``temperature == 0`` take the argmax."""
    if method not in ("sort", "rejection"):
        return None
    logits = logits.astype("float32")
    if on_host(logits):
        t, k, p, m, u = (x.numpy() for x in (temperature, top_k, top_p, min_p, uniforms))
        return paddle.to_tensor(_host_sample(as_array(logits), t, k, p, m, u, method))
    greedy = paddle.argmax(logits, axis=-1)
    if not bool((temperature > 0).any()):
        return greedy
    probs = _temperature_probs(logits, temperature)
    if method == "sort":
        drawn = _sample_sorted(probs, top_k, top_p, min_p, uniforms[:, 0])
    else:
        drawn = _sample_rejection(probs, top_k, top_p, min_p, uniforms)
    return paddle.where(temperature > 0, drawn, greedy)


# ---------------------------------------------------------------- CPU: per row, float64


def _host_sample(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
                 min_p: np.ndarray, uniforms: np.ndarray, method: str) -> np.ndarray:
    """``logits [B, V]`` fp32 -> int64 ``[B]``, each row computed on its own."""
    out = np.asarray(logits.argmax(axis=-1), np.int64)  # greedy rows (first maximum)
    for i in np.flatnonzero(temperature > 0):
        w = _row_weights(logits[i], float(temperature[i]), float(min_p[i]))
        if w is None:
            continue  # no finite maximum: the argmax stands
        k, p, u = int(top_k[i]), float(top_p[i]), uniforms[i].astype(np.float64)
        out[i] = _draw_sorted(w, k, p, u[0]) if method == "sort" else _draw_rejection(w, k, p, u)
    return out


def _row_weights(row: np.ndarray, temperature: float, min_p: float) -> np.ndarray | None:
    """``exp(row / T - max)`` in float64 (the most likely token weighs 1),
    zero where min-p drops the token (``p < min_p * max p``)."""
    z = row.astype(np.float64) / temperature
    top = z.max()
    if not np.isfinite(top):
        return None
    w = np.exp(z - top)
    if min_p > 0:
        w[w < min_p] = 0.0
    return w


def _draw_sorted(w: np.ndarray, top_k: int, top_p: float, u: float) -> int:
    """Inverse CDF at ``u`` of the top-k / top-p set of weights ``w [V]``."""
    ids = np.flatnonzero(w)  # ascending ids: a stable sort puts equal weights in id order
    cw = w[ids]
    if 0 < top_k < ids.size:
        kth = np.partition(cw, ids.size - top_k)[ids.size - top_k]
        keep = cw > kth
        ties = np.flatnonzero(cw == kth)[: top_k - int(np.count_nonzero(keep))]
        keep[ties] = True  # the lowest ids among equal k-th weights
        ids, cw = ids[keep], cw[keep]
    total = float(cw.sum())
    head = HEAD
    while True:
        complete = head >= ids.size
        if complete:
            part_ids, part = ids, cw
        else:  # the `head` largest weights (with ties: all equal to the smallest of them)
            cut = np.partition(cw, ids.size - head)[ids.size - head]
            sel = cw >= cut
            part_ids, part = ids[sel], cw[sel]
        order = _descending(part)  # a prefix of the whole row's order
        cdf = np.cumsum(part[order])
        n, mass = cdf.size, total
        if top_p < 1.0:
            cut_mass = top_p * total
            if not complete and cdf[-1] < cut_mass:
                head *= 64  # the top-p cut lies past the head
                continue
            before = np.concatenate(([0.0], cdf[:-1]))  # mass strictly ahead of each token
            n = max(int(np.searchsorted(before, cut_mass, side="left")), 1)
            mass = float(cdf[n - 1])
        j = int(np.searchsorted(cdf[:n], u * mass, side="right"))
        if j < n or complete or top_p < 1.0:
            return int(part_ids[order[min(j, n - 1)]])
        head *= 64  # the draw lies past the head


def _descending(w: np.ndarray) -> np.ndarray:
    """Indices sorting ``w`` by weight, descending, equal weights by index
    (a quicksort and a fix-up of the tie runs: ~4x faster than a stable sort)."""
    order = np.argsort(-w)
    ranked = w[order]
    tied = ranked[1:] == ranked[:-1]
    if not tied.any():
        return order
    run = np.concatenate(([0], np.cumsum(~tied)))  # the tie run of each sorted position
    return np.sort(run * w.size + order) % w.size


def _draw_rejection(w: np.ndarray, top_k: int, top_p: float, uniforms: np.ndarray) -> int:
    """The rejection method of ``_sample_rejection`` for one row."""
    vocab = w.size
    k = top_k if 0 < top_k < vocab else vocab
    total = float(np.partition(w, vocab - k)[vocab - k:].sum()) if k < vocab else float(w.sum())
    pivot = 0.0
    for r in range(uniforms.size - 1):
        candidates = np.where(w > pivot, w, 0.0)
        cdf = np.cumsum(candidates)
        token = int(np.searchsorted(cdf, uniforms[r] * cdf[-1], side="right"))
        if token >= vocab:  # u rounded onto the total: the last candidate
            token = int(np.flatnonzero(candidates)[-1])
        p = w[token]
        above = w > p
        rank = int(np.count_nonzero(above))
        if rank < k and (rank == 0 or float(w[above].sum()) < top_p * total):
            return token
        pivot = p
    return _draw_sorted(w, top_k, top_p, float(uniforms[-1]))
