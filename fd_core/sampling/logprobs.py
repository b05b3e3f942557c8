"""Logprobs of sampled and prompt tokens, with the top-k alternatives.

Values are ``log_softmax`` of the model's *raw* logits: before logit_bias,
bans, penalties, temperature and the top-k/top-p/min-p filters (vLLM v1's
default "raw logprobs"). They describe the model, not the sampler: a token
the filters excluded still has its model logprob, and temperature does not
change them. Ranks are 1-based; a token's rank counts every token whose
logprob is at least its own (so ties rank it last among equals, as vLLM).

FastDeploy's two per-request options change that for sampled tokens:
``temp_scaled_logprobs`` takes the log_softmax of ``raw / temperature``
(greedy requests are not scaled), and ``top_p_normalized_logprobs`` (when
``top_p < 1``) keeps the smallest set of most likely tokens whose mass
reaches ``top_p`` -- a token is kept while the mass of the tokens before it
is at most ``top_p`` -- and renormalises over it; tokens outside get the
lowest float32 (FastDeploy clips ``-inf`` the same way).

Only the rows that ask are gathered and normalised; results are plain
Python objects (no tensors leave this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle

__all__ = ["EXCLUDED_LOGPROB", "Logprobs", "compute_prompt_logprobs", "gather_logprobs", "top_p_normalized"]

paddle = import_paddle()
Tensor = Any

# prompt rows normalised per chunk, so a long prompt never holds [P, V] fp32 twice
PROMPT_CHUNK_ROWS = 512
# logprob of a token outside the top-p set (FastDeploy clips -inf to this)
EXCLUDED_LOGPROB = float(np.finfo(np.float32).min)


@dataclass
class Logprobs:
    """One token's logprob, its rank, and the most likely alternatives."""

    token_id: int  # the sampled token (or the actual next prompt token)
    logprob: float
    rank: int  # 1 = the most likely token
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


def _log_softmax(logits: Tensor) -> Tensor:
    # x - logsumexp(x), not paddle.nn.functional.log_softmax: paddle 3.3's CPU log_softmax takes ~9 s
    # for a [1, 103424] row (its Eigen kernel), logsumexp ~1 ms
    return logits - paddle.logsumexp(logits, axis=-1, keepdim=True)


def _logprobs(logits: Tensor, token_ids: np.ndarray, num_top: Sequence[int]) -> list[Logprobs]:
    """Entries for ``logits [M, V]`` and ``token_ids [M]``, top ``num_top[m]`` each."""
    return _entries(_log_softmax(logits.astype("float32")), token_ids, num_top)


def top_p_normalized(logprobs: Tensor, top_p: np.ndarray) -> Tensor:
    """``logprobs [M, V]`` renormalised over each row's top-``top_p[m]`` set."""
    order = paddle.argsort(logprobs, axis=-1, descending=True)  # [M, V]
    probs = paddle.exp(paddle.take_along_axis(logprobs, order, axis=-1))
    before = paddle.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
    keep_sorted = before <= paddle.to_tensor(top_p.astype(np.float32)).unsqueeze(-1)
    mass = (probs * keep_sorted.astype("float32")).sum(axis=-1, keepdim=True)
    keep = paddle.put_along_axis(paddle.zeros_like(logprobs), order,
                                 keep_sorted.astype("float32"), axis=-1) > 0
    return paddle.where(keep, logprobs - paddle.log(mass),
                        paddle.full_like(logprobs, EXCLUDED_LOGPROB))


def _entries(logprobs: Tensor, token_ids: np.ndarray, num_top: Sequence[int]) -> list[Logprobs]:
    """Entries for normalised ``logprobs [M, V]``."""
    ids = paddle.to_tensor(np.asarray(token_ids, np.int64)).unsqueeze(-1)
    chosen = paddle.take_along_axis(logprobs, ids, axis=-1)  # [M, 1]
    ranks = (logprobs >= chosen).astype("int64").sum(axis=-1).numpy()
    chosen_np = chosen.squeeze(-1).numpy()
    k = min(max(num_top, default=0), logprobs.shape[1])
    top_ids = top_vals = np.zeros((len(token_ids), 0))
    if k > 0:
        vals, ids_k = paddle.topk(logprobs, k=k, axis=-1)  # [M, k], best first
        top_vals, top_ids = vals.numpy(), ids_k.numpy()
    entries = []
    for m, token in enumerate(np.asarray(token_ids).tolist()):
        kk = min(num_top[m], k)
        top = list(zip(top_ids[m, :kk].tolist(), top_vals[m, :kk].tolist()))
        entries.append(Logprobs(int(token), float(chosen_np[m]), int(ranks[m]), top))
    return entries


def gather_logprobs(
    raw_logits: Tensor, rows: Sequence[int], token_ids: Sequence[int], num_top: Sequence[int],
    temperatures: Sequence[float] | None = None, top_ps: Sequence[float] | None = None,
) -> list[Logprobs]:
    """Logprobs of ``token_ids[j]`` in row ``rows[j]`` of ``raw_logits [N, V]``.

    Called by the sampler after a step with the rows whose request asked for
    logprobs; ``num_top[j]`` is that request's ``logprobs`` (0 = only the
    sampled token). Only those rows are gathered and normalised.
    ``temperatures[j]`` (1 = none) divides row j's logits first;
    ``top_ps[j]`` (1 = none) renormalises it over its top-p set.
    """
    if not rows:
        return []
    picked = paddle.gather(raw_logits, paddle.to_tensor(np.asarray(rows, np.int64)), axis=0)
    picked = picked.astype("float32")
    if temperatures is not None and any(t != 1.0 for t in temperatures):
        scale = np.asarray(temperatures, np.float32).reshape(-1, 1)
        picked = picked / paddle.to_tensor(scale)
    logprobs = _log_softmax(picked)
    if top_ps is not None and any(p < 1.0 for p in top_ps):
        top_p = np.asarray(top_ps, np.float32)
        normalized = top_p_normalized(logprobs, top_p)
        wants = paddle.to_tensor((top_p < 1.0).reshape(-1, 1))
        logprobs = paddle.where(wants, normalized, logprobs)
    return _entries(logprobs, np.asarray(token_ids, np.int64), list(num_top))


def compute_prompt_logprobs(
    logits: Tensor, prompt_token_ids: Sequence[int], k: int
) -> list[Logprobs]:
    """Logprobs of each prompt token after the first, with the top ``k``.

    ``logits [P, V]`` are the model's raw logits at prompt positions; row
    ``i`` predicts ``prompt_token_ids[i + 1]``. ``prompt_token_ids`` holds
    ``P + 1`` tokens (a chunk of a prompt followed by the token after it) or
    ``P`` (a whole prompt; the last row, which predicts the first output
    token, is unused). Returns one entry per predicted token, in order:
    entry ``j`` is for ``prompt_token_ids[j + 1]`` (OpenAI reports the very
    first prompt token as None; the caller adds that).
    """
    num_rows = logits.shape[0]
    tokens = np.asarray(prompt_token_ids, np.int64)
    if len(tokens) not in (num_rows, num_rows + 1):
        raise ValueError(
            f"compute_prompt_logprobs: logits have {num_rows} rows, so prompt_token_ids must "
            f"hold {num_rows} or {num_rows + 1} tokens, got {len(tokens)}"
        )
    if k < 0:
        raise ValueError(f"compute_prompt_logprobs: k must be >= 0, got {k}")
    targets = tokens[1:]
    entries: list[Logprobs] = []
    for start in range(0, len(targets), PROMPT_CHUNK_ROWS):
        chunk = targets[start:start + PROMPT_CHUNK_ROWS]
        entries.extend(_logprobs(logits[start:start + len(chunk)], chunk, [k] * len(chunk)))
    return entries
