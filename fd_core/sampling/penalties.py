"""Logits processors: logit_bias, bans (bad words, min_tokens) and penalties.

Each function takes the step's ``logits [N, V]`` (fp32, one row per request)
and the rows' ``SamplingState`` and returns new logits; nothing is changed in
place. A processor that no row needs costs nothing.

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

Cost per step: a request's lists (logit_bias, bad words, stop ids) are turned
into index arrays and a bad-words automaton once, the first time the request
is sampled (``request_bans``); a step then costs O(entries it applies) per row,
not O(list length), and one scatter for the whole batch. Penalties touch only
the (row, token) pairs a penalised row has seen: one gather and one scatter,
not a pass over ``[N, V]`` for every row because one row asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.sampling.bad_words import BadWordsMatcher

if TYPE_CHECKING:
    from fd_core.sampling.params import SamplingParams
    from fd_core.sampling.sampler import SamplingState

__all__ = ["RequestBans", "apply_bias_and_bans", "apply_penalties", "banned_token_ids", "request_bans"]

paddle = import_paddle()
Tensor = Any

# logit_bias entries above which a request's bias is one dense row: adding a [V] row costs
# about as much as scattering this many entries, and stays the same for any bias size
DENSE_BIAS_MIN = 4096


@dataclass
class RequestBans:
    """A request's bias and bans, precomputed from its state once."""

    params: SamplingParams  # the params (and word list) this was built from
    words_source: list[list[int]]
    bias_ids: np.ndarray  # int64 [B]: logit_bias tokens
    bias_values: np.ndarray  # float32 [B]: their biases
    words: BadWordsMatcher  # bad words (one-token and longer)
    min_tokens_ids: np.ndarray  # int64: stop_token_ids, and eos unless ignore_eos
    # a large logit_bias is added as one dense [V] row (vocab -> tensor), not scattered each step
    _dense: dict[int, Tensor] = field(default_factory=dict)

    @property
    def dense_bias(self) -> bool:
        return len(self.bias_ids) > DENSE_BIAS_MIN

    def bias_row(self, vocab: int, place: Any) -> Tensor:
        """The logit_bias as a ``[V]`` fp32 tensor on ``place`` (zeros elsewhere), built once."""
        row = self._dense.get(vocab)
        if row is None:
            _checked_index([np.zeros(len(self.bias_ids), np.int64)], [self.bias_ids], vocab, "logit_bias")
            dense = np.zeros(vocab, np.float32)
            dense[self.bias_ids] = self.bias_values
            row = self._dense[vocab] = paddle.to_tensor(dense, place=place)
        return row

    @classmethod
    def build(cls, state: SamplingState) -> RequestBans:
        params = state.params
        bias = params.logit_bias or {}
        held = list(params.stop_token_ids)
        if not params.ignore_eos:
            held += list(state.eos_token_ids)
        return cls(
            params=params,
            words_source=state.bad_words_token_ids,
            bias_ids=np.fromiter(bias.keys(), np.int64, len(bias)),
            bias_values=np.fromiter(bias.values(), np.float32, len(bias)),
            words=BadWordsMatcher(state.bad_words_token_ids),
            min_tokens_ids=np.unique(np.asarray(held, np.int64)),
        )

    def banned(self, output: Sequence[int]) -> np.ndarray:
        """Token ids (int64, possibly repeated) banned after ``output``."""
        words = self.words.banned(output)
        if len(output) < self.params.min_tokens and len(self.min_tokens_ids):
            return np.concatenate([words, self.min_tokens_ids]) if len(words) else self.min_tokens_ids
        return words


# SamplingState -> its RequestBans; SamplingState is eq=False (hashed by identity), and
# an entry goes when its state does. (A field of SamplingState would do the same.)
def request_bans(state: SamplingState) -> RequestBans:
    """``state``'s precomputed bias and bans, built on first use (O(its lists))."""
    bans = state.bans
    if bans is None or bans.params is not state.params or bans.words_source is not state.bad_words_token_ids:
        bans = state.bans = RequestBans.build(state)
    return bans  # type: ignore[no-any-return]


def banned_token_ids(state: SamplingState) -> list[int]:
    """Token ids this request may not sample at its next step (may repeat)."""
    return request_bans(state).banned(state.output_token_ids).tolist()


def _checked_index(rows: list[np.ndarray], tokens: list[np.ndarray], vocab: int, what: str) -> np.ndarray:
    """``[M, 2]`` int64 (row, token) pairs; token ids must be < vocab."""
    row = np.concatenate(rows).astype(np.int64)
    tok = np.concatenate(tokens).astype(np.int64)
    bad = (tok < 0) | (tok >= vocab)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"{what}: token id {int(tok[i])} of request row {int(row[i])} is outside the "
            f"vocabulary [0, {vocab}); validate requests with SamplingState.create(vocab_size=...)"
        )
    return np.stack([row, tok], axis=1)


def apply_bias_and_bans(logits: Tensor, states: Sequence[SamplingState]) -> Tensor:
    """Add each row's ``logit_bias`` and set its banned tokens to ``-inf``.

    One ``scatter_nd_add``: bans add ``-inf`` (``-inf`` plus a bias or
    another ``-inf`` is still ``-inf``), biases add their value. A row with
    a large ``logit_bias`` gets it as a dense row first (one gather, add and
    scatter of the rows that have one).
    """
    rows, tokens, values, dense = [], [], [], []
    for i, state in enumerate(states):
        bans = request_bans(state)
        if bans.dense_bias:
            dense.append((i, bans))
        elif len(bans.bias_ids):
            rows.append(np.full(len(bans.bias_ids), i, np.int64))
            tokens.append(bans.bias_ids)
            values.append(bans.bias_values)
        banned = bans.banned(state.output_token_ids)
        if len(banned):
            rows.append(np.full(len(banned), i, np.int64))
            tokens.append(banned)
            values.append(np.full(len(banned), -np.inf, np.float32))
    if dense:
        vocab = logits.shape[1]
        which = paddle.to_tensor(np.asarray([i for i, _ in dense], np.int64))
        biased = paddle.gather(logits, which) + paddle.stack(
            [bans.bias_row(vocab, logits.place) for _, bans in dense])  # [R, V]
        logits = paddle.scatter(logits, which, biased, overwrite=True)
    if not rows:
        return logits
    index = _checked_index(rows, tokens, logits.shape[1], "logit_bias or banned tokens")
    return paddle.scatter_nd_add(logits, paddle.to_tensor(index), paddle.to_tensor(np.concatenate(values)))


def apply_penalties(logits: Tensor, states: Sequence[SamplingState]) -> Tensor:
    """Repetition, presence and frequency penalties of the rows that ask.

    Only the tokens a penalised row has seen change (an unseen token's factor
    is 1 and its count 0), so those are gathered, penalised with the same
    fp32 operations as a dense pass, and written back.
    """
    active = [i for i, s in enumerate(states) if s.params.has_penalties]
    if not active:
        return logits
    rows, tokens, counts, repetition, presence, frequency = [], [], [], [], [], []
    for i in active:
        state, params = states[i], states[i].params
        output, num = np.unique(np.asarray(state.output_token_ids, np.int64), return_counts=True)
        if params.repetition_penalty != 1.0:
            seen = np.union1d(output, state.unique_prompt_token_ids)
            count = np.zeros(len(seen), np.float32)
            count[np.searchsorted(seen, output)] = num
        else:
            seen, count = output, num.astype(np.float32)
        rows.append(np.full(len(seen), i, np.int64))
        tokens.append(seen)
        counts.append(count)
        repetition.append(np.full(len(seen), params.repetition_penalty, np.float32))
        presence.append(np.full(len(seen), params.presence_penalty, np.float32))
        frequency.append(np.full(len(seen), params.frequency_penalty, np.float32))
    if sum(len(r) for r in rows) == 0:
        return logits
    shape = list(logits.shape)
    index = _checked_index(rows, tokens, shape[1], "output or prompt tokens")  # [M, 2]
    values = paddle.gather_nd(logits, paddle.to_tensor(index))  # [M]
    if any(states[i].params.repetition_penalty != 1.0 for i in active):
        factor = paddle.to_tensor(np.concatenate(repetition))
        values = paddle.where(values > 0, values / factor, values * factor)
    if any(states[i].params.presence_penalty or states[i].params.frequency_penalty for i in active):
        count_t = paddle.to_tensor(np.concatenate(counts))
        values = (values - paddle.to_tensor(np.concatenate(frequency)) * count_t
                  - paddle.to_tensor(np.concatenate(presence)) * (count_t > 0).astype("float32"))
    flat = paddle.to_tensor(index[:, 0] * shape[1] + index[:, 1])  # [M] positions in logits.flatten()
    return paddle.scatter(logits.reshape([-1]), flat, values, overwrite=True).reshape(shape)
