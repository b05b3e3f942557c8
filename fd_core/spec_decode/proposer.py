"""The interface every CPU-side draft proposer keeps, and the factory.

Who calls what (the engine core, through ``fd_core.engine.speculative``):

- ``add_request(id, prompt)`` when a request is admitted (once; preemption and
  recompute do not repeat it: the proposer's state is the request's token
  history, which recompute does not change);
- ``append(id, tokens)`` after each step with the tokens the verifier
  accepted (accepted drafts + the target's token); never the rejected drafts,
  so a proposer has nothing to roll back;
- ``propose(id, max_tokens)`` before scheduling a decode step: up to
  ``max_tokens`` draft tokens (the engine passes k, less where max_tokens,
  max_model_len or the token budget leave less room); ``[]`` costs the step
  nothing: the request decodes one token as without speculation;
- ``finish(id)`` when the request ends (finished or aborted).

State per request is updated incrementally: ``append`` costs O(new tokens)
(times the n-gram sizes or the tree depth), ``propose`` is independent of
the history's length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from fd_core.spec_decode.config import SpeculativeConfig

__all__ = ["Proposer", "make_proposer"]


class Proposer(ABC):
    """Drafts tokens for running requests from CPU-side state alone."""

    @abstractmethod
    def add_request(self, request_id: str, prompt_token_ids: Sequence[int]) -> None:
        """Start tracking ``request_id`` with its prompt (raises if already tracked)."""

    @abstractmethod
    def append(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Add verified output tokens to the request's history."""

    @abstractmethod
    def propose(self, request_id: str, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` draft tokens to follow the request's history."""

    @abstractmethod
    def finish(self, request_id: str, keep_output: bool = True) -> None:
        """Forget the request; ``keep_output``: a proposer with a cross-request
        cache may keep its output there (False for an aborted request)."""

    def propose_batch(self, request_ids: Sequence[str], max_tokens: Sequence[int]) -> list[list[int]]:
        """``propose`` for each request, in order."""
        return [self.propose(r, k) for r, k in zip(request_ids, max_tokens)]


def make_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer for ``config.method`` (``ngram`` or ``suffix``); ``mtp``
    drafts with a model and is built by the runner, not here."""
    if config.method == "ngram":
        from fd_core.spec_decode.ngram import NgramProposer

        return NgramProposer(config.min_ngram_size, config.max_ngram_size)
    if config.method == "suffix":
        from fd_core.spec_decode.suffix import SuffixProposer

        return SuffixProposer(
            max_depth=config.suffix_decoding_max_tree_depth,
            max_cached_requests=config.suffix_decoding_max_cached_requests,
            max_spec_factor=config.suffix_decoding_max_spec_factor,
            min_token_prob=config.suffix_decoding_min_token_prob,
        )
    raise ValueError(f"method {config.method!r} has no CPU-side proposer; the MTP drafter runs in the model runner")
