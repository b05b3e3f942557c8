"""The Sampler: one step's logits and per-request state in, one token per row out.

Order of work in ``Sampler.sample`` (as vLLM v1):

1. raw logprobs are taken from the logits as they come (see ``logprobs``);
2. ``logit_bias``, then bans (bad words, ``min_tokens``) (``penalties``);
3. the engine's ``--logits-processors`` rows switched on (``logits_processors``);
4. repetition, presence and frequency penalties (``penalties``);
4b. structured output: the step's token bitmask (``fd_core.structured``)
    sets the tokens each constrained row's grammar forbids to -inf, through
    the backend op ``apply_token_bitmask``;
5. the backend's ``sample`` op: temperature, min-p -> top-k -> top-p and the
   draw; greedy rows take the argmax of the processed logits;
6. the thinking budget may replace the drawn token by one of its forced
   sequence (``</think>`` by default; ``reasoning_budget``); logprobs
   describe the token finally emitted;
7. with early stop on, each row's confidence run is updated (``early_stop``).

Reproducibility: every request owns a numpy ``Generator`` (seeded from
``seed``, or from OS entropy when it has none) in its ``SamplingState``, and
each token a non-greedy request samples consumes exactly ``NUM_UNIFORMS``
uniforms from it, whatever the method and however many the op uses. A row's
token depends only on its own logits, parameters and uniforms (on CPU the op
and the early-stop check compute each row on its own, in float64), so given
the same logits a seeded request samples the same tokens alone or in any
batch, at any row, across preemption and chunked prefill. Whether the model
gives the same logits is the backend's matter: on the CPU backends a row's
logits can differ in the last bits with the step's row count (see the
README, "Seeds and batch invariance"). Greedy requests draw nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fd_core import envs
from fd_core._paddle import import_paddle
from fd_core.ops._host import as_array, on_host
from fd_core.sampling.early_stop import EarlyStopConfig
from fd_core.sampling.logits_processors import LogitsProcessor, apply_logits_processors
from fd_core.sampling.logprobs import Logprobs, gather_logprobs
from fd_core.sampling.params import SamplingParams
from fd_core.sampling.penalties import apply_bias_and_bans, apply_penalties
from fd_core.sampling.reasoning_budget import ReasoningBudget, ThinkingTokens, prompt_ends_reasoning

__all__ = ["NUM_UNIFORMS", "Sampler", "SamplerOutput", "SamplingState"]

paddle = import_paddle()
Tensor = Any

# Uniforms per sampled token (R). Part of the seed contract: changing it
# changes every seeded request's tokens. "sort" uses the first; "rejection"
# uses up to all of them (the same count as the conformance suite gives).
NUM_UNIFORMS = 16

# FD_SAMPLING_CLASS value -> method of the sample op
_METHODS = {"base": "sort", "sort": "sort", "rejection": "rejection"}


def new_generator(seed: int | None) -> np.random.Generator:
    """A request's generator: from ``seed`` (any int, taken mod 2**64), else OS entropy."""
    return np.random.default_rng(None if seed is None else seed % 2**64)


@dataclass(eq=False)
class SamplingState:
    """What the sampler keeps for one request across steps.

    Created once per request by the engine (``create``) and passed, one per
    logits row, to every step that samples for the request. The engine
    appends each kept token to ``output_token_ids`` (it may share its own
    list); the sampler only reads it. A step whose token will be discarded
    (e.g. a partial prefill chunk) must not include the request: sampling
    advances the generator.
    """

    params: SamplingParams
    generator: np.random.Generator
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: list[int] = field(default_factory=list)
    eos_token_ids: tuple[int, ...] = ()
    # token-id sequences: params.bad_words_token_ids plus the engine's
    # tokenization of params.bad_words
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    # the thinking budget, when params.reasoning_max_tokens is set and the
    # output starts inside reasoning
    reasoning: ReasoningBudget | None = None
    confident_steps: int = 0  # early stop: consecutive steps with p(token) > threshold
    _unique_prompt: np.ndarray | None = field(default=None, init=False, repr=False)
    # penalties.RequestBans: the request's bias and bans compiled once (see penalties.request_bans)
    bans: Any = field(default=None, init=False, repr=False)

    @classmethod
    def create(
        cls,
        params: SamplingParams,
        prompt_token_ids: Sequence[int] = (),
        *,
        eos_token_ids: Sequence[int] = (),
        bad_words_token_ids: Sequence[Sequence[int]] = (),
        output_token_ids: list[int] | None = None,
        vocab_size: int | None = None,
        thinking: ThinkingTokens | None = None,
    ) -> SamplingState:
        """A request's state, its generator seeded from ``params.seed``.

        ``thinking`` holds the model's ``</think>`` (and ``<think>``) ids; a
        request with ``reasoning_max_tokens`` needs them (ValueError without).

        ``bad_words_token_ids`` are the engine's tokenization of
        ``params.bad_words``; ``params.bad_words_token_ids`` are added to
        them. With ``vocab_size``, every token id the request names (logit
        bias, stop ids, bad words) is checked to be below it (ValueError).
        For ``n > 1`` each sequence gets its own state; to keep seeded
        sequences apart, create sequence ``i``'s from
        ``params.replace(seed=params.seed + i)`` (vLLM's convention).
        """
        words = [list(w) for w in (params.bad_words_token_ids or [])]
        words += [list(w) for w in bad_words_token_ids if len(w) > 0]
        if vocab_size is not None:
            named = {
                "logit_bias": list(params.logit_bias or {}),
                "stop_token_ids": list(params.stop_token_ids),
                "bad_words_token_ids": [t for w in words for t in w],
            }
            for name, ids in named.items():
                out = [t for t in ids if not 0 <= t < vocab_size]
                if out:
                    raise ValueError(
                        f"{name} holds token id {out[0]}, outside the vocabulary [0, {vocab_size})"
                    )
        reasoning = None
        if params.reasoning_max_tokens is not None:
            if thinking is None:
                raise ValueError(
                    "reasoning_max_tokens needs a model whose tokenizer has a '</think>' token; "
                    "this one has none, so the reasoning cannot be closed"
                )
            if not prompt_ends_reasoning(prompt_token_ids, thinking):
                reasoning = ReasoningBudget(params.reasoning_max_tokens, thinking.end_id,
                                            thinking.forced_ids)
        return cls(
            params=params,
            generator=new_generator(params.seed),
            prompt_token_ids=prompt_token_ids,
            output_token_ids=[] if output_token_ids is None else output_token_ids,
            eos_token_ids=tuple(eos_token_ids),
            bad_words_token_ids=words,
            reasoning=reasoning,
        )

    @property
    def unique_prompt_token_ids(self) -> np.ndarray:
        """The distinct prompt token ids (int64), computed once."""
        if self._unique_prompt is None:
            self._unique_prompt = np.unique(np.asarray(self.prompt_token_ids, np.int64))
        return self._unique_prompt

    def draw_uniforms(self) -> np.ndarray:
        """The ``NUM_UNIFORMS`` float32 uniforms in [0, 1) for one sampled token."""
        return self.generator.random(NUM_UNIFORMS, dtype=np.float32)


@dataclass
class SamplerOutput:
    """One step's result, row by row (plain Python, no tensors)."""

    sampled_token_ids: list[int]  # row -> token id
    logprobs: list[Logprobs | None]  # row -> entry when the request asked for logprobs
    early_stopped: list[bool] = field(default_factory=list)  # row -> early stop triggered


class Sampler:
    """Turns a step's logits into one token per request; see the module docstring.

    ``method`` is ``"sort"`` or ``"rejection"`` (FD_SAMPLING_CLASS's
    ``"base"`` means ``"sort"``); by default it comes from FD_SAMPLING_CLASS.
    ``vocab_size`` is the tokenizer's: logits columns beyond it (vocabulary
    padding) are never sampled. ``logits_processors`` are the engine's
    loaded ``--logits-processors``; ``early_stop`` turns the repetition
    early stop on.
    """

    def __init__(
        self, ops: Any, vocab_size: int, method: str | None = None, *,
        logits_processors: Sequence[LogitsProcessor] = (), early_stop: EarlyStopConfig | None = None,
    ) -> None:
        if method is None:
            method = envs.get("FD_SAMPLING_CLASS")
        if method not in _METHODS:
            raise ValueError(
                f"sampling method must be one of {', '.join(sorted(_METHODS))}, got {method!r}"
            )
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.ops = ops
        self.vocab_size = vocab_size
        self.method = _METHODS[method]
        self.logits_processors = list(logits_processors)
        self.early_stop = early_stop

    def sample(self, logits: Tensor, requests: Sequence[SamplingState],
               token_bitmask: tuple[np.ndarray, list[int]] | None = None,
               uniforms: np.ndarray | None = None) -> SamplerOutput:
        """Sample one token per row of ``logits [N, V]``; ``requests[i]`` owns row i.

        Called by the model runner once per step with the logits of the
        requests that sample. Advances each non-greedy request's generator
        by one draw (unless ``uniforms [N, NUM_UNIFORMS]``, drawn earlier by
        ``draw_uniforms``, are given); reads, never changes, their token lists.
        ``token_bitmask``: ``(bitmask [M, W] int32, rows)`` from structured
        output: mask row k constrains logits row ``rows[k]``.
        """
        n, vocab = logits.shape
        if n != len(requests):
            raise ValueError(f"logits have {n} rows but {len(requests)} requests were given")
        if vocab < self.vocab_size:
            raise ValueError(f"logits have {vocab} columns, fewer than vocab_size {self.vocab_size}")
        if n == 0:
            return SamplerOutput([], [])
        if logits.dtype != paddle.float32:
            logits = logits.astype("float32")
        if vocab > self.vocab_size:
            logits = logits[:, : self.vocab_size]
        raw = logits
        logits = apply_bias_and_bans(logits, requests)
        if self.logits_processors:
            logits = apply_logits_processors(self.logits_processors, logits, requests)
        logits = apply_penalties(logits, requests)
        if token_bitmask is not None and token_bitmask[1]:
            if logits is raw and any(s.params.logprobs is not None for s in requests):
                logits = logits.clone()  # the op may write in place: logprobs read the raw logits
            logits = self.ops.apply_token_bitmask(logits, token_bitmask[0], list(token_bitmask[1]))
        drawn = self._draw(logits, requests, uniforms)
        tokens = (drawn if isinstance(drawn, np.ndarray) else drawn.numpy()).tolist()
        for i, state in enumerate(requests):
            if state.reasoning is not None:
                tokens[i] = state.reasoning.next_token(state.output_token_ids, tokens[i],
                                                       state.eos_token_ids)
        stopped = ([False] * n if self.early_stop is None
                   else _early_stop(self.early_stop, logits, requests, tokens))
        return SamplerOutput(tokens, self._logprobs(raw, requests, tokens), stopped)

    def row_params(self, requests: Sequence[SamplingState]) -> tuple[np.ndarray, ...]:
        """The sample op's per-row arguments ``(temperature [N] fp32, top_k [N] int64, top_p [N] fp32,
        min_p [N] fp32)``; greedy rows have temperature 0."""
        n = len(requests)
        temperature = np.zeros(n, np.float32)
        top_k = np.zeros(n, np.int64)
        top_p = np.ones(n, np.float32)
        min_p = np.zeros(n, np.float32)
        for i, state in enumerate(requests):
            p = state.params
            if p.greedy:
                continue  # temperature 0: the op takes the argmax
            # a top_k at or past the vocabulary keeps everything (and must not overflow int64)
            k = p.top_k if p.top_k < self.vocab_size else 0
            temperature[i], top_k[i], top_p[i], min_p[i] = p.temperature, k, p.top_p, p.min_p
        return temperature, top_k, top_p, min_p

    @staticmethod
    def draw_uniforms(requests: Sequence[SamplingState]) -> np.ndarray:
        """``[N, NUM_UNIFORMS]`` fp32: one token's uniforms for each non-greedy row (advancing its
        generator by one draw), zeros for greedy rows."""
        uniforms = np.zeros((len(requests), NUM_UNIFORMS), np.float32)
        for i, state in enumerate(requests):
            if not state.params.greedy:
                uniforms[i] = state.draw_uniforms()
        return uniforms

    def _draw(self, logits: Tensor, requests: Sequence[SamplingState], uniforms: np.ndarray | None) -> Any:
        if all(s.params.greedy for s in requests):
            if on_host(logits):  # numpy's argmax is ~8x paddle's CPU kernel ([32, 103424]: 0.3 vs 2.7 ms)
                return as_array(logits).argmax(axis=-1)
            return paddle.argmax(logits, axis=-1)
        temperature, top_k, top_p, min_p = self.row_params(requests)
        if uniforms is None:
            uniforms = self.draw_uniforms(requests)
        return self.ops.sample(
            logits, paddle.to_tensor(temperature), paddle.to_tensor(top_k),
            paddle.to_tensor(top_p), paddle.to_tensor(min_p), paddle.to_tensor(uniforms),
            self.method,
        )

    def _logprobs(
        self, raw: Tensor, requests: Sequence[SamplingState], tokens: list[int]
    ) -> list[Logprobs | None]:
        rows = [i for i, s in enumerate(requests) if s.params.logprobs is not None]
        entries: list[Logprobs | None] = [None] * len(requests)
        params = [requests[i].params for i in rows]
        temperatures = [p.temperature if p.temp_scaled_logprobs and not p.greedy else 1.0
                        for p in params]
        top_ps = [p.top_p if p.top_p_normalized_logprobs else 1.0 for p in params]
        found = gather_logprobs(raw, rows, [tokens[i] for i in rows],
                                [p.logprobs or 0 for p in params], temperatures, top_ps)
        for i, entry in zip(rows, found):
            entries[i] = entry
        return entries


def _early_stop(config: EarlyStopConfig, logits: Tensor, requests: Sequence[SamplingState],
                tokens: list[int]) -> list[bool]:
    """Update each row's run of confident steps; True where it reaches the window.

    p(token) is computed row by row in float64 (paddle's ``logsumexp`` over
    ``[N, V]`` rounds a row differently with the batch size), so the decision
    is the same at any row of any batch."""
    rows = as_array(logits) if on_host(logits) else logits.numpy()  # [N, V], what the draw sees
    stopped = []
    for state, row, token in zip(requests, rows, tokens):
        scale = 1.0 if state.params.greedy else float(np.float32(state.params.temperature))
        z = row.astype(np.float64) / scale
        top = z.max()
        p = float(np.exp(z[token] - top) / np.exp(z - top).sum())
        state.confident_steps = state.confident_steps + 1 if p > config.threshold else 0
        stopped.append(state.confident_steps >= config.window_size)
    return stopped
