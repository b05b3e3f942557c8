"""Drawing tokens from logits: temperature, min-p, top-k, top-p.

The filters apply in this order, each to what the previous left:
``probs = softmax(logits / T)``; min-p drops tokens with
``p < min_p * max(p)``; top-k keeps the k most likely; top-p keeps the
smallest most-likely set whose renormalised mass reaches ``top_p`` (the
token that crosses it is kept). The draw is the inverse CDF of the kept,
renormalised distribution at ``u`` (sorted by probability, descending).
"""

from __future__ import annotations

from typing import Any

from fd_core._paddle import import_paddle

__all__ = ["reference_sample", "filtered_probs"]

paddle = import_paddle()
F = paddle.nn.functional


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
    greedy = paddle.argmax(logits, axis=-1)
    if not bool((temperature > 0).any()):
        return greedy
    probs = _temperature_probs(logits, temperature)
    if method == "sort":
        drawn = _sample_sorted(probs, top_k, top_p, min_p, uniforms[:, 0])
    else:
        drawn = _sample_rejection(probs, top_k, top_p, min_p, uniforms)
    return paddle.where(temperature > 0, drawn, greedy)
