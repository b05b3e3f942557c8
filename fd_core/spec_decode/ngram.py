"""N-gram (prompt lookup) proposer.

For the last n tokens of a request's history, n from ``max_n`` down to
``min_n``, find the most recent earlier occurrence of those n tokens in the
same history (prompt + verified output) and propose the tokens that followed
it. The first n that matches wins (the longest match). Where the history ends
before ``max_tokens`` followed, the copy reads on into its own output (as an
LZ77 copy whose source overlaps its destination), so a repetition with a
period shorter than ``max_tokens`` (a loop of one or two tokens) still drafts
``max_tokens``.

Index: per request and per n, a dict from the n-gram (a tuple) to the end
position of its most recent occurrence, holding every n-gram that ends
before the history's last token (the last n tokens themselves are the query,
not a match). ``append`` indexes the n-grams that stop being the last, so
it costs O(new tokens * sizes); ``propose`` is at most ``sizes`` dict lookups
and one slice, whatever the history's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fd_core.spec_decode.proposer import Proposer

__all__ = ["NgramProposer"]


@dataclass
class _History:
    tokens: list[int] = field(default_factory=list)
    # n -> {n-gram: end position of its latest occurrence}, n-grams ending before tokens[-1]
    index: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)
    indexed_until: int = 0  # n-grams ending at positions < this are in the index


class NgramProposer(Proposer):
    """Prompt lookup over each request's own tokens; no state shared between requests."""

    def __init__(self, min_n: int = 2, max_n: int = 5) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_ngram_size <= max_ngram_size, "
                             f"got min {min_n}, max {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._requests: dict[str, _History] = {}

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int]) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already tracked by the n-gram proposer")
        h = _History(index={n: {} for n in range(self.min_n, self.max_n + 1)})
        self._requests[request_id] = h
        self._extend(h, prompt_token_ids)

    def append(self, request_id: str, token_ids: Sequence[int]) -> None:
        self._extend(self._requests[request_id], token_ids)

    def propose(self, request_id: str, max_tokens: int) -> list[int]:
        h = self._requests[request_id]
        tokens, size = h.tokens, len(h.tokens)
        if max_tokens <= 0 or size < self.min_n + 1:
            return []
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            end = h.index[n].get(tuple(tokens[size - n:]))
            if end is not None:
                # what followed the match, read on into the draft itself where it runs
                # out (an overlapping copy): a period-p repetition drafts max_tokens, not p
                follow = tokens[end + 1: end + 1 + max_tokens]
                return [follow[i % len(follow)] for i in range(max_tokens)]
        return []

    def finish(self, request_id: str, keep_output: bool = True) -> None:
        self._requests.pop(request_id, None)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def _extend(self, h: _History, new: Sequence[int]) -> None:
        tokens = h.tokens
        tokens.extend(int(t) for t in new)
        last = len(tokens) - 1  # the n-grams ending here are the query: index up to last - 1
        for end in range(h.indexed_until, last):
            for n, table in h.index.items():
                if end + 1 >= n:
                    table[tuple(tokens[end + 1 - n: end + 1])] = end
        h.indexed_until = max(h.indexed_until, last)
