"""Structured output: grammar engines behind one interface, per-step token bitmasks.

Owns turning a request's ``GuidedDecodingParams`` (``fd_core.sampling.guided``:
a JSON schema, regex, choice list, Lark/GBNF grammar or structural tag) into
a compiled grammar (cached per constraint and model), one matcher per
request, and the int32 token bitmask of a step's constrained rows, which the
sampler applies through the backend op ``Ops.apply_token_bitmask``.

- ``vocab``: the model's token bytes, special ids and EOS set, built once
  from fd_core's tokenizer (``GrammarVocab``);
- ``backend``: the interface (``GrammarBackend``, ``GrammarMatcher``,
  ``GrammarError``); ``llguidance_backend`` (the default, no torch) and
  ``xgrammar_backend`` (optional: it needs torch) implement it;
- ``manager``: ``StructuredOutputs``, what the engine core calls: compile on
  a thread pool while the request waits outside the scheduler, fill a step's
  bitmask, accept sampled tokens, finish requests whose grammar completed,
  start constraints after the reasoning ends.

Runs in the engine process; the API process only builds GuidedDecodingParams.
May import: fd_core.sampling (params and the reasoning budget), numpy,
llguidance, xgrammar. Never paddle.
"""

from __future__ import annotations

from fd_core.structured.backend import GrammarBackend, GrammarError, GrammarMatcher
from fd_core.structured.manager import BACKEND_CHOICES, StructuredOutputs, make_backend
from fd_core.structured.vocab import GrammarVocab

__all__ = ["BACKEND_CHOICES", "GrammarBackend", "GrammarError", "GrammarMatcher", "GrammarVocab",
           "StructuredOutputs", "make_backend"]
