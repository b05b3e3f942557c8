"""Speculative decoding in the engine core: drafts in, verified tokens out.

Who calls what (``EngineCore`` only):

- ``add_request`` when a request is queued: the proposer starts tracking its
  prompt when the request's parameters let speculation stay exact (see
  ``blocker``); other requests simply decode one token per step;
- ``verify`` after the forward, with the logits of every scored position of
  the requests that carried drafts (``ScheduledRequest.num_draft_tokens``;
  the runner returns those rows through ``StepInput.all_logits``): greedy
  prefix acceptance, or the rejection rule on the sampler's own filtered
  distribution with uniforms from the request's seeded generator
  (``fd_core.spec_decode.verify``); logprobs of the emitted tokens as the
  sampler computes them;
- ``after_update`` with the scheduler's updates: the emitted (verified,
  stop-truncated) tokens go to the proposer, and the next step's drafts to
  the scheduler (``Scheduler.set_draft_token_ids``);
- ``finish`` when a request ends or is aborted.

Exactness: a drafted row's logits go through no history-dependent processing
here, so requests whose logits the sampler changes per position (penalties,
logit_bias, bad words, logits processors, the reasoning budget, guided
decoding, the engine's early stop; image inputs, whose positions are not a
token count) get no drafts: they decode as without speculation. ``min_tokens`` holds drafts back until it is reached.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fd_core.engine.model_runner import StepInput
from fd_core.engine.scheduler_output import RequestUpdate, ScheduledRequest
from fd_core.ops._host import as_array, on_host
from fd_core.sampling.logprobs import Logprobs, gather_logprobs
from fd_core.sampling.sampler import NUM_UNIFORMS, SamplingState
from fd_core.spec_decode.config import SpeculativeConfig
from fd_core.spec_decode.proposer import Proposer, make_proposer
from fd_core.spec_decode.verify import verify, verify_greedy

__all__ = ["SpecDecodeStats", "SpeculativeDecoder", "blocker", "step_input"]

logger = logging.getLogger(__name__)


@dataclass
class SpecDecodeStats:
    """Totals since start (FastDeploy's ``spec_decode_*`` metrics)."""

    num_draft_tokens: int = 0  # drafts scored by the target
    num_accepted_tokens: int = 0  # of which accepted
    num_emitted_tokens: int = 0  # tokens out of verified steps (accepted + the target's own)
    num_verify_steps: int = 0  # request-steps that carried drafts

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted (FastDeploy's spec_decode_draft_acceptance_rate)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def efficiency(self) -> float:
        """Emitted / the most those steps could emit (drafts + 1 each): FastDeploy's
        spec_decode_efficiency (vLLM's system efficiency)."""
        most = self.num_draft_tokens + self.num_verify_steps
        return self.num_emitted_tokens / most if most else 0.0


def step_input(scheduled: Sequence[ScheduledRequest], num_decodes: int, all_logits: Sequence[bool],
               mm_inputs: Sequence[Any]) -> StepInput:
    """The runner's step with each request that carries drafts (the scheduler puts
    them right after the plain decodes) as ``1 + d`` one-token decode rows: row j
    holds token j, the request's block table, and ``seq_len`` up to and including
    it. The decode path writes every row's KV before any row attends, so row j
    sees the tokens before it and not those after: the causal mask of a ragged
    query, computed by the decode kernels that compute the same token without
    speculation. Each row returns its logits, so the request's ``1 + d`` rows come
    in order, as ``all_logits`` would give them. Called by the engine core."""
    tokens: list[list[int]] = []
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    needs: list[bool] = []
    whole: list[bool] = []
    mm: list[Any] = []
    rows = 0
    for i, s in enumerate(scheduled):
        if s.num_draft_tokens:
            assert i >= num_decodes and (i == 0 or scheduled[i - 1].num_draft_tokens or i == num_decodes)
            n = s.num_tokens
            tokens += [[t] for t in s.token_ids]
            seq_lens += [s.num_computed_tokens + j + 1 for j in range(n)]
            tables += [s.block_ids] * n
            needs += [True] * n
            whole += [False] * n
            mm += [None] * n
            rows += n
            continue
        tokens.append(s.token_ids)
        seq_lens.append(s.seq_len)
        tables.append(s.block_ids)
        needs.append(s.samples)
        whole.append(all_logits[i])
        mm.append(mm_inputs[i] if mm_inputs else None)
        rows += i < num_decodes
    return StepInput(tokens, seq_lens, tables, rows, needs, whole, mm if mm_inputs else [])


def blocker(state: SamplingState, early_stop: bool, guided: bool, multimodal: bool = False) -> str | None:
    """Why this request cannot speculate exactly (its logits are processed per
    position with history the drafted rows lack), or None when it can."""
    p = state.params
    reasons = [
        (guided, "guided decoding (structured output)"),
        (multimodal, "image inputs (their positions are not a token count)"),
        (early_stop, "the engine's early stop"),
        (bool(p.logit_bias), "logit_bias"),
        (bool(state.bad_words_token_ids), "bad words"),
        (p.has_penalties, "repetition/presence/frequency penalties"),
        (bool(p.logits_processors_args), "logits processors"),
        (state.reasoning is not None, "reasoning_max_tokens"),
    ]
    return next((why for hit, why in reasons if hit), None)


class SpeculativeDecoder:
    """One proposer for the engine's requests, verification, and the counters."""

    def __init__(self, config: SpeculativeConfig, vocab_size: int, max_model_len: int,
                 early_stop: bool = False, runner: Any = None, model_dir: Any = None) -> None:
        """``runner`` / ``model_dir``: the model runner (after its KV pool exists) and
        the target's checkpoint, for method ``mtp`` (``fd_core.spec_decode.mtp``)."""
        self.config = config
        self.proposer: Proposer
        if config.method == "mtp":
            from fd_core.spec_decode.mtp import MtpProposer

            self.proposer = MtpProposer(config, runner, model_dir)
        else:
            self.proposer = make_proposer(config)
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.early_stop = early_stop
        self.stats = SpecDecodeStats()
        self._states: dict[str, SamplingState] = {}  # request id -> state, requests that speculate
        self.last_step: dict[str, tuple[int, int]] = {}  # request id -> (drafted, accepted), last verify

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], state: SamplingState,
                    guided: bool, multimodal: bool = False) -> None:
        why = blocker(state, self.early_stop, guided, multimodal)
        if why is not None:
            logger.debug("request %s decodes without speculation: %s", request_id, why)
            return
        self.proposer.add_request(request_id, prompt_token_ids)
        self._states[request_id] = state

    def speculates(self, request_id: str) -> bool:
        return request_id in self._states

    def finish(self, request_id: str, keep_output: bool = True) -> None:
        """Forget the request (``keep_output``: a suffix proposer may keep its output)."""
        if self._states.pop(request_id, None) is not None:
            self.proposer.finish(request_id, keep_output)

    # ------------------------------------------------------------ verification

    def verify(self, logits: Any, items: Sequence[tuple[ScheduledRequest, int]]
               ) -> tuple[dict[str, list[int]], dict[str, list[Logprobs]]]:
        """``items``: (scheduled request with drafts, its first row in ``logits [N, V]``).
        Returns request id -> emitted tokens (accepted drafts, then the target's),
        and request id -> their logprobs (requests that asked)."""
        index = np.concatenate([np.arange(row, row + s.num_tokens) for s, row in items])
        host = as_array(logits) if on_host(logits) else logits.numpy()
        rows = np.asarray(host[index, : self.vocab_size], np.float32)  # [M, V]: this step's scored rows
        drafts = [s.token_ids[-s.num_draft_tokens:] for s, _ in items]
        states = [self._states[s.request_id] for s, _ in items]
        if all(st.params.greedy for st in states):
            result = verify_greedy(rows, drafts)
        else:
            temperature, top_k, top_p, min_p, uniforms = self._sampling_arrays(states, drafts)
            result = verify(rows, drafts, temperature, top_k, top_p, min_p, uniforms)
        tokens: dict[str, list[int]] = {}
        stats = self.stats
        self.last_step = {}
        for (s, _), emitted, accepted in zip(items, result.token_ids, result.num_accepted):
            tokens[s.request_id] = emitted
            stats.num_draft_tokens += s.num_draft_tokens
            stats.num_accepted_tokens += accepted
            stats.num_emitted_tokens += len(emitted)
            stats.num_verify_steps += 1
            self.last_step[s.request_id] = (s.num_draft_tokens, accepted)
        return tokens, self._logprobs(rows, items, states, tokens)

    def _sampling_arrays(self, states: Sequence[SamplingState], drafts: Sequence[Sequence[int]]
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The sampler's per-request parameters and ``k + 1`` uniform rows per
        request from its generator (greedy requests draw nothing, as in the sampler)."""
        n = len(states)
        temperature = np.zeros(n, np.float32)
        top_k = np.zeros(n, np.int64)
        top_p = np.ones(n, np.float32)
        min_p = np.zeros(n, np.float32)
        uniforms = []
        for i, (state, draft) in enumerate(zip(states, drafts)):
            u = np.zeros((len(draft) + 1, NUM_UNIFORMS), np.float32)
            p = state.params
            if not p.greedy:
                temperature[i], top_p[i], min_p[i] = p.temperature, p.top_p, p.min_p
                top_k[i] = p.top_k if p.top_k < self.vocab_size else 0
                for j in range(len(u)):
                    u[j] = state.draw_uniforms()
            uniforms.append(u)
        return temperature, top_k, top_p, min_p, np.concatenate(uniforms)

    def _logprobs(self, rows: np.ndarray, items: Sequence[tuple[ScheduledRequest, int]],
                  states: Sequence[SamplingState], tokens: dict[str, list[int]]) -> dict[str, list[Logprobs]]:
        """Logprobs of each emitted token from its own row, as ``Sampler._logprobs``."""
        picked, ids, tops, temps, top_ps, owners = [], [], [], [], [], []
        start = 0
        for (s, _), state in zip(items, states):
            p = state.params
            if p.logprobs is not None:
                for j, tok in enumerate(tokens[s.request_id]):
                    picked.append(start + j)
                    ids.append(tok)
                    tops.append(p.logprobs or 0)
                    temps.append(p.temperature if p.temp_scaled_logprobs and not p.greedy else 1.0)
                    top_ps.append(p.top_p if p.top_p_normalized_logprobs else 1.0)
                    owners.append(s.request_id)
            start += s.num_tokens
        out: dict[str, list[Logprobs]] = {}
        if picked:
            from fd_core._paddle import import_paddle

            entries = gather_logprobs(import_paddle().to_tensor(rows), picked, ids, tops, temps, top_ps)
            for rid, entry in zip(owners, entries):
                out.setdefault(rid, []).append(entry)
        return out

    # ------------------------------------------------------------ the next drafts

    def after_update(self, updates: Sequence[RequestUpdate], scheduler: Any,
                     scheduled: Sequence[ScheduledRequest] = ()) -> None:
        """Feed the step's emitted tokens to the proposer and hand the scheduler
        each still-running speculating request's drafts for the next step.
        ``scheduled``: the step's requests (the MTP drafter runs over them)."""
        wants = self._wants(updates)
        mtp = getattr(self.proposer, "run", None)
        if mtp is not None:
            mtp(scheduled, scheduler, wants)
        for update in updates:
            rid = update.request.request_id
            if rid in self._states and update.new_token_ids:
                self.proposer.append(rid, update.new_token_ids)
            if rid in wants:
                scheduler.set_draft_token_ids(rid, self.proposer.propose(rid, wants[rid]))

    def _wants(self, updates: Sequence[RequestUpdate]) -> dict[str, int]:
        """Request id -> drafts to propose for its next step (k, less near
        max_tokens / max_model_len), for the running speculating requests."""
        k = self.config.num_speculative_tokens
        wants: dict[str, int] = {}
        for update in updates:
            req = update.request
            rid = req.request_id
            if rid not in self._states:
                continue
            if update.finished or req.is_finished or req.num_output_tokens < req.min_tokens:
                continue
            # a step emits at most drafts + 1 tokens: no drafts past max_tokens or max_model_len
            room = self.max_model_len - req.num_tokens - 1
            if req.max_tokens is not None:
                room = min(room, req.max_tokens - req.num_output_tokens - 1)
            if room > 0:
                wants[rid] = min(k, room)
        return wants
