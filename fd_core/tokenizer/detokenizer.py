"""Incremental detokenization for streaming: token ids in, newly completed text out.

Each token id maps to a fixed byte string (`Tokenizer.token_bytes`), and
`Tokenizer.decode` is those bytes decoded as UTF-8 with errors="replace". So
the detokenizer feeds the bytes of new tokens to Python's incremental UTF-8
decoder: text is released as soon as its characters are complete, a character
split over several byte-fallback tokens waits (no U+FFFD for an incomplete
sequence), an invalid sequence becomes U+FFFD exactly where a full decode puts
it. This is exact where vLLM's window of previous tokens is a heuristic, and
each call costs O(new tokens).

Invariant: `"".join(deltas) + finish() == tokenizer.decode(all_ids, skip_special_tokens)`.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from fd_core.tokenizer.tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer"]


class IncrementalDetokenizer:
    """Streams the text of one sequence of generated token ids."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []  # every id fed so far
        self._deltas: list[str] = []  # every non-empty delta returned so far
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = tokenizer.strips_leading_space  # sentencepiece's dummy "▁" prefix

    def add(self, token_ids: int | Iterable[int]) -> str:
        """Feed one or more new ids; returns the text they complete (may be "")."""
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        data = b"".join(self.tokenizer.token_bytes(i, self.skip_special_tokens) for i in ids)
        self.token_ids.extend(ids)
        return self._emit(self._decoder.decode(data))

    def finish(self) -> str:
        """End of sequence: bytes of an unfinished character come out as U+FFFD (as decode does)."""
        return self._emit(self._decoder.decode(b"", final=True))

    @property
    def has_pending_bytes(self) -> bool:
        """True while the last tokens hold part of a UTF-8 character not yet returned."""
        return bool(self._decoder.getstate()[0])

    @property
    def text(self) -> str:
        """All text returned so far (joins the deltas: O(length), call it rarely)."""
        return "".join(self._deltas)

    def _emit(self, delta: str) -> str:
        if self._strip_space and delta:
            self._strip_space = False
            delta = delta[1:] if delta.startswith(" ") else delta
        if delta:
            self._deltas.append(delta)
        return delta
