"""``StructuredOutputs``: the engine core's one object for constrained requests.

Who calls what (all from the engine thread, ``fd_core.engine.core``):

- ``add(request_id, guided, request, ...)`` when a request arrives: checks
  the constraint at once (GrammarError, a ValueError the server answers
  with 400) and starts compiling it on a thread pool, cached per
  ``(backend, kind, text, whitespace)``; the request is *held here*, not in
  the scheduler, so a grammar still compiling never holds up a step;
- ``admit()`` at the start of each step: the held requests whose grammar is
  ready (to add to the scheduler) and those whose compile failed (to finish
  with the error; only that request fails, never the engine);
- ``bitmask(request_ids)`` after the forward: one int32 bitmask for the
  step's sampled rows, filled for the constrained ones in one call (rows of
  unconstrained requests, or of requests still reasoning, are left out);
- ``accept(request_ids, tokens)`` after sampling: advances each active
  matcher; returns the requests to finish (grammar complete, or a token it
  refused) with why;
- ``drop(request_id)`` when a request ends.

Reasoning: a request with ``after_reasoning`` (the server runs a reasoning
parser) is unconstrained until its reasoning is over: its prompt closed the
think block, or its output holds ``</think>`` and the thinking budget
(``reasoning_max_tokens``) is not in the middle of its forced sequence.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fd_core.sampling.guided import GuidedDecodingParams
from fd_core.sampling.reasoning_budget import ReasoningBudget, ThinkingTokens, prompt_ends_reasoning
from fd_core.structured.backend import GrammarBackend, GrammarError, GrammarMatcher, bitmask_words
from fd_core.structured.vocab import GrammarVocab

__all__ = ["BACKEND_CHOICES", "StructuredOutputs", "make_backend"]

logger = logging.getLogger(__name__)
BACKEND_CHOICES = ("auto", "llguidance", "xgrammar", "off")
MAX_CACHED = 256  # compiled grammars kept (least recently used dropped)


def make_backend(name: str, vocab: GrammarVocab, any_whitespace: bool) -> GrammarBackend:
    """The backend called ``name`` ("auto" = llguidance) on ``vocab``."""
    if name in ("auto", "llguidance"):
        from fd_core.structured.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(vocab, any_whitespace=any_whitespace)
    if name == "xgrammar":
        from fd_core.structured.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(vocab, any_whitespace=any_whitespace)
    raise ValueError(f"guided decoding backend must be one of {', '.join(BACKEND_CHOICES)}, got {name!r}")


@dataclass(eq=False)
class _Guided:
    """One request's matcher and where its constraint starts."""

    matcher: GrammarMatcher | None  # None while compiling
    output: list[int]  # the request's output tokens (the engine's own list)
    active: bool  # constrained from the next token on
    end_id: int | None = None  # "</think>" while waiting for the reasoning to end
    budget: ReasoningBudget | None = None
    future: cf.Future[Any] | None = None
    request: Any = None  # held until admitted
    name: str = ""  # the backend compiling / matching it
    backend: GrammarBackend | None = field(default=None, repr=False)

    def update_active(self) -> bool:
        if not self.active and self.end_id is not None:
            if self.budget is not None:
                self.active = self.budget.reasoning_over(self.output)
            else:
                self.active = self.end_id in self.output
        return self.active


class StructuredOutputs:
    """Compiles, holds and matches constrained requests for one engine; see the module doc."""

    def __init__(self, vocab_factory: Callable[[], GrammarVocab], backend: str = "auto", *,
                 any_whitespace: bool = True, thinking: ThinkingTokens | None = None,
                 max_workers: int = 2) -> None:
        if backend not in BACKEND_CHOICES:
            raise ValueError(f"--guided-decoding-backend must be one of {', '.join(BACKEND_CHOICES)}, "
                             f"got {backend!r}")
        self.default_backend = backend
        self.any_whitespace = any_whitespace
        self.thinking = thinking
        self._vocab_factory = vocab_factory
        self._vocab: GrammarVocab | None = None
        self._backends: dict[str, GrammarBackend] = {}
        self._lock = threading.Lock()
        self._pool = cf.ThreadPoolExecutor(max_workers, thread_name_prefix="fd-grammar")
        self._cache: dict[tuple[str, str, str, bool], cf.Future[Any]] = {}
        self._requests: dict[str, _Guided] = {}
        self._held: list[str] = []  # compiling, in arrival order

    # ------------------------------------------------------------ arrival

    def _backend(self, name: str) -> GrammarBackend:
        """The backend ``name`` (built once, on first use: any thread)."""
        with self._lock:
            if name not in self._backends:
                if self._vocab is None:
                    self._vocab = self._vocab_factory()
                self._backends[name] = make_backend(name, self._vocab, self.any_whitespace)
            return self._backends[name]

    def backend_name(self, guided: GuidedDecodingParams) -> str:
        name = guided.backend if guided.backend not in (None, "auto") else self.default_backend
        if name == "off":
            raise GrammarError("structured output is off on this server (--guided-decoding-backend off); "
                               "remove the constraint or start the server with --guided-decoding-backend auto")
        return "llguidance" if name == "auto" else str(name)

    def add(self, request_id: str, guided: GuidedDecodingParams, request: Any, output: list[int],
            prompt_token_ids: Sequence[int] = (), budget: ReasoningBudget | None = None) -> None:
        """Check ``guided`` (GrammarError naming the problem) and start compiling it;
        ``request`` is held until ``admit`` hands it back. ``output`` is the request's
        output-token list (read to find the end of its reasoning)."""
        name = self.backend_name(guided)
        kind, text = guided.spec()
        ws = self.any_whitespace and not guided.disable_any_whitespace
        if name == "llguidance":
            from fd_core.structured.llguidance_backend import LLGuidanceBackend

            LLGuidanceBackend.validate(kind, text, ws)  # fast, no vocabulary: a 400 now, not later
        key = (name, kind, text, ws)
        future = self._cache.pop(key, None)
        if future is None or (future.done() and future.exception() is not None):
            future = self._pool.submit(lambda: self._backend(name).compile(kind, text, any_whitespace=ws))
        self._cache[key] = future  # most recent last
        while len(self._cache) > MAX_CACHED:
            self._cache.pop(next(iter(self._cache)))
        waits = guided.after_reasoning and self.thinking is not None and not prompt_ends_reasoning(
            prompt_token_ids, self.thinking)
        self._requests[request_id] = _Guided(
            None, output, active=not waits, end_id=self.thinking.end_id if waits and self.thinking else None,
            budget=budget if waits else None, future=future, request=request, name=name)
        self._held.append(request_id)

    def has_held(self) -> bool:
        """True while a request waits for its grammar."""
        return bool(self._held)

    def admit(self, wait_s: float = 0.0) -> tuple[list[Any], list[tuple[Any, str]]]:
        """``(ready requests, [(failed request, error)])`` among the held ones, in
        arrival order; waits up to ``wait_s`` for a compile when nothing is ready."""
        if not self._held:
            return [], []
        if wait_s > 0 and not any(self._requests[r].future.done() for r in self._held):  # type: ignore[union-attr]
            cf.wait([self._requests[r].future for r in self._held], wait_s,  # type: ignore[misc]
                    return_when=cf.FIRST_COMPLETED)
        ready, failed, still = [], [], []
        for rid in self._held:
            g = self._requests[rid]
            assert g.future is not None
            if not g.future.done():
                still.append(rid)
                continue
            error = g.future.exception()
            if error is None:
                backend = self._backends[g.name]
                g.matcher, g.backend = backend.matcher(g.future.result()), backend
                ready.append(g.request)
            else:
                msg = str(error) if isinstance(error, GrammarError) else f"grammar compile failed: {error!r}"
                logger.warning("request %s: %s", rid, msg)
                failed.append((g.request, msg))
                del self._requests[rid]
            g.future, g.request = None, None
        self._held = still
        return ready, failed

    def drop(self, request_id: str) -> None:
        """Forget a finished or aborted request (held or running)."""
        if self._requests.pop(request_id, None) is not None and request_id in self._held:
            self._held.remove(request_id)

    def is_guided(self, request_id: str) -> bool:
        return request_id in self._requests

    # --------------------------------------------------------------- step

    def bitmask(self, request_ids: Sequence[str]) -> tuple[np.ndarray, list[int]] | None:
        """``(bitmask [M, W] int32, rows)``: the masks of the constrained requests
        among the step's sampled ``request_ids`` (row ``rows[k]`` of the step's
        logits gets mask row k), or None when no row is constrained."""
        active = [(self._requests[rid], row) for row, rid in enumerate(request_ids)
                  if rid in self._requests and self._requests[rid].update_active()]
        active = [(g, row) for g, row in active if g.matcher is not None]
        if not active:
            return None
        backend = active[0][0].backend
        assert backend is not None and self._vocab is not None
        mask = np.empty((len(active), bitmask_words(self._vocab.vocab_size)), np.int32)
        if all(g.backend is backend for g, _ in active):
            backend.fill_bitmasks([(g.matcher, k) for k, (g, _) in enumerate(active)], mask)  # type: ignore[misc]
        else:
            for k, (g, _) in enumerate(active):
                g.matcher.fill_bitmask(mask, k)  # type: ignore[union-attr]
        return mask, [row for _, row in active]

    def accept(self, request_ids: Sequence[str], tokens: Sequence[int]) -> dict[str, str | None]:
        """Advance the active matchers by the step's sampled tokens; the requests
        to finish now: id -> None (the grammar is complete: a normal stop) or the
        error (the grammar refused the token)."""
        finish: dict[str, str | None] = {}
        for rid, token in zip(request_ids, tokens):
            g = self._requests.get(rid)
            if g is None or not g.active or g.matcher is None:
                continue
            if not g.matcher.accept_token(token):
                why = g.matcher.error() or f"token {token} is not allowed here"
                finish[rid] = f"the output left its grammar: {why}"
            elif g.matcher.is_terminated():
                finish[rid] = None
        return finish

    def rollback(self, request_id: str, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` tokens a request's matcher accepted (speculative decoding)."""
        g = self._requests[request_id]
        if g.matcher is not None and num_tokens:
            g.matcher.rollback(num_tokens)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
