"""The interface every grammar engine answers behind: compile, then match.

``GrammarBackend`` (one per engine and model, built once from the model's
``GrammarVocab``): ``compile(kind, text)`` turns a constraint (the ``spec()``
of a ``GuidedDecodingParams``) into an opaque compiled grammar, raising
``GrammarError`` naming the problem; ``matcher(compiled)`` starts one
request's ``GrammarMatcher``; ``fill_bitmasks`` fills a step's rows of a
batch bitmask in one call. ``StructuredOutputs`` (``manager``) is the only
caller: it compiles on its thread pool (so a backend's ``compile`` must be
thread-safe) and matches on the engine thread.

A bitmask is an int32 numpy array ``[rows, ceil(V / 32)]``: bit ``j`` of
word ``w`` set allows token ``32 * w + j`` (xgrammar's and llguidance's
layout). ``fill`` writes one row completely.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from fd_core.structured.vocab import GrammarVocab

__all__ = ["GrammarBackend", "GrammarError", "GrammarMatcher", "bitmask_words"]


class GrammarError(ValueError):
    """A constraint that does not compile: the message names what is wrong and where."""


def bitmask_words(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return (vocab_size + 31) // 32


class GrammarMatcher(ABC):
    """One request's position in its grammar; driven by the engine thread only."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by the sampled token; False when the grammar does not allow it
        (the matcher is then unusable: the request must end)."""

    @abstractmethod
    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]``."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once the grammar is complete and its EOS was accepted (or it can
        take nothing more): the request is done."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (speculative decoding)."""

    def error(self) -> str | None:
        """Why the matcher stopped working, when it did (None otherwise)."""
        return None


class GrammarBackend(ABC):
    """A grammar engine bound to one model's vocabulary."""

    name: str = ""

    def __init__(self, vocab: GrammarVocab, *, any_whitespace: bool = True) -> None:
        self.vocab = vocab
        self.any_whitespace = any_whitespace

    @abstractmethod
    def compile(self, kind: str, text: str, *, any_whitespace: bool | None = None) -> Any:
        """The compiled form of ``(kind, text)`` (kinds: json, regex, choice,
        grammar, structural_tag); GrammarError naming the problem.
        ``any_whitespace`` (JSON): None = the backend's default."""

    @abstractmethod
    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the grammar's start."""

    def fill_bitmasks(self, matchers: Sequence[tuple[GrammarMatcher, int]], bitmask: np.ndarray) -> None:
        """Fill ``bitmask[row]`` for each ``(matcher, row)``; a backend with a
        parallel batch fill overrides this."""
        for matcher, row in matchers:
            matcher.fill_bitmask(bitmask, row)
