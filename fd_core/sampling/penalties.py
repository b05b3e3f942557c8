"""Logits processors: logit_bias, bans (bad words, min_tokens) and penalties.

Each function takes the step's ``logits [N, V]`` (fp32, one row per request)
and the rows' ``SamplingState`` and returns new logits; nothing is changed in
place. Host work is a loop over requests that builds small index arrays;
the tensor work is one scatter per kind and a few elementwise ops, with no
per-vocabulary loop. A processor that no row needs costs nothing.

Semantics (vLLM v1):

- ``logit_bias``: ``logits[t] += bias[t]``.
- bad words: a one-token word is always banned; a longer word bans its last
  token when the output so far ends with the word's other tokens.
- ``min_tokens``: while ``len(output) < min_tokens``, ``stop_token_ids`` and
  (unless ``ignore_eos``) the eos ids are banned.
- repetition penalty (HF / vLLM) over prompt and output tokens: a seen
  token's logit is divided by the penalty when positive, multiplied when not.
- presence / frequency penalty (OpenAI) over output tokens only:
  ``logits[t] -= presence * (count[t] > 0) + frequency * count[t]``.

A banned token's logit becomes ``-inf`` and stays so through the penalties.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fd_core._paddle import import_paddle

if TYPE_CHECKING:
    from fd_core.sampling.sampler import SamplingState

__all__ = ["apply_bias_and_bans", "apply_penalties", "banned_token_ids"]

paddle = import_paddle()
Tensor = Any


def banned_token_ids(state: SamplingState) -> list[int]:
    """Token ids this request may not sample at its next step."""
    output = state.output_token_ids
    banned = []
    for word in state.bad_words_token_ids:
        prefix = len(word) - 1
        if prefix > len(output):
            continue
        if prefix == 0 or list(output[-prefix:]) == list(word[:-1]):
            banned.append(word[-1])
    if len(output) < state.params.min_tokens:
        banned.extend(state.params.stop_token_ids)
        if not state.params.ignore_eos:
            banned.extend(state.eos_token_ids)
    return banned


def _checked_index(rows: list[np.ndarray], tokens: list[np.ndarray], vocab: int, what: str) -> Any:
    """``[M, 2]`` int64 (row, token) pairs as a tensor; token ids must be < vocab."""
    row = np.concatenate(rows).astype(np.int64)
    tok = np.concatenate(tokens).astype(np.int64)
    bad = (tok < 0) | (tok >= vocab)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"{what}: token id {int(tok[i])} of request row {int(row[i])} is outside the "
            f"vocabulary [0, {vocab}); validate requests with SamplingState.create(vocab_size=...)"
        )
    return paddle.to_tensor(np.stack([row, tok], axis=1))


def apply_bias_and_bans(logits: Tensor, states: Sequence[SamplingState]) -> Tensor:
    """Add each row's ``logit_bias`` and set its banned tokens to ``-inf``.

    One ``scatter_nd_add``: bans add ``-inf`` (``-inf`` plus a bias or
    another ``-inf`` is still ``-inf``), biases add their value.
    """
    rows, tokens, values = [], [], []
    for i, state in enumerate(states):
        bias = state.params.logit_bias
        if bias:
            ids = np.fromiter(bias.keys(), np.int64, len(bias))
            rows.append(np.full(len(ids), i, np.int64))
            tokens.append(ids)
            values.append(np.fromiter(bias.values(), np.float32, len(bias)))
        banned = banned_token_ids(state)
        if banned:
            rows.append(np.full(len(banned), i, np.int64))
            tokens.append(np.asarray(banned, np.int64))
            values.append(np.full(len(banned), -np.inf, np.float32))
    if not rows:
        return logits
    index = _checked_index(rows, tokens, logits.shape[1], "logit_bias or banned tokens")
    return paddle.scatter_nd_add(logits, index, paddle.to_tensor(np.concatenate(values)))


def _token_presence(shape: list[int], rows: list[np.ndarray], tokens: list[np.ndarray],
                    what: str) -> Tensor:
    """``[N, V]`` fp32 count of each (row, token) pair (zeros when none)."""
    zeros = paddle.zeros(shape, dtype="float32")
    if not rows or sum(len(r) for r in rows) == 0:
        return zeros
    index = _checked_index(rows, tokens, shape[1], what)
    return paddle.scatter_nd_add(zeros, index, paddle.ones([index.shape[0]], dtype="float32"))


def apply_penalties(logits: Tensor, states: Sequence[SamplingState]) -> Tensor:
    """Repetition, presence and frequency penalties of the rows that ask."""
    active = [i for i, s in enumerate(states) if s.params.has_penalties]
    if not active:
        return logits
    n = len(states)
    repetition = np.ones(n, np.float32)
    presence = np.zeros(n, np.float32)
    frequency = np.zeros(n, np.float32)
    out_rows, out_tokens, prompt_rows, prompt_tokens = [], [], [], []
    for i in active:
        state, params = states[i], states[i].params
        repetition[i] = params.repetition_penalty
        presence[i] = params.presence_penalty
        frequency[i] = params.frequency_penalty
        output = np.asarray(state.output_token_ids, np.int64)
        out_rows.append(np.full(len(output), i, np.int64))
        out_tokens.append(output)
        if params.repetition_penalty != 1.0:
            prompt = state.unique_prompt_token_ids
            prompt_rows.append(np.full(len(prompt), i, np.int64))
            prompt_tokens.append(prompt)
    shape = list(logits.shape)
    counts = _token_presence(shape, out_rows, out_tokens, "output tokens")  # [N, V]
    in_output = (counts > 0).astype("float32")
    if prompt_rows:
        in_prompt = _token_presence(shape, prompt_rows, prompt_tokens, "prompt tokens")
        seen = (in_prompt > 0) | (counts > 0)
        penalty = paddle.to_tensor(repetition).unsqueeze(-1).expand(shape)
        factor = paddle.where(seen, penalty, paddle.ones_like(logits))
        logits = paddle.where(logits > 0, logits / factor, logits * factor)
    if presence.any() or frequency.any():
        logits = (logits - paddle.to_tensor(frequency).unsqueeze(-1) * counts
                  - paddle.to_tensor(presence).unsqueeze(-1) * in_output)
    return logits
