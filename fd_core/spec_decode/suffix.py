"""Suffix decoding proposer (after Arctic Inference's SuffixDecoding).

Two bounded-depth suffix trees (``suffix_tree.SuffixTree``) answer "what
followed the end of this history before?":

- a per-request tree over the request's own prompt and verified output,
  grown as tokens arrive (its cursor's deepest nodes are the history's
  suffixes: a node with children is a suffix that occurred earlier);
- a global tree over the outputs of finished requests, at most
  ``max_cached_requests`` of them (the oldest leave first; -1: no bound, 0: no
  global tree), matched by a read-only cursor per request that is rebuilt
  from the last ``max_depth`` tokens when the tree changed. Evicted outputs
  leave the tree in batches: it is rebuilt from the kept outputs once a
  quarter of the bound has been evicted (drafts from an evicted output in the
  meantime are harmless: verification decides what is emitted).

``propose``: in each tree take the deepest matching suffix of at most
``max_depth - max_tokens`` tokens (so the continuation has room) whose node
has children; the draft is the most frequent path below it
(``SuffixTree.continuation``), at most ``floor(max_spec_factor * match
length)`` tokens, stopping once the path probability falls below
``min_token_prob``. The tree whose path has the higher expected number of
accepted tokens (sum of path probabilities) wins; ties go to the request's
own tree.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from fd_core.spec_decode.proposer import Proposer
from fd_core.spec_decode.suffix_tree import Cursor, SuffixTree

__all__ = ["SuffixProposer"]


@dataclass
class _Request:
    tree: SuffixTree
    tokens: list[int] = field(default_factory=list)
    num_prompt: int = 0
    cursor: Cursor = field(default_factory=list)  # of tokens, in its own tree
    global_cursor: Cursor = field(default_factory=list)  # read-only, in the global tree
    global_version: int = -1  # the global tree's version global_cursor was built for


class SuffixProposer(Proposer):
    """Suffix-tree drafts from the request's own tokens and earlier requests' outputs."""

    def __init__(self, max_depth: int = 64, max_cached_requests: int = 10000, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1) -> None:
        if max_depth < 2:
            raise ValueError(f"suffix_decoding_max_tree_depth must be >= 2, got {max_depth}")
        self.max_depth = max_depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.global_tree = SuffixTree(max_depth)
        self._cached: OrderedDict[str, list[int]] = OrderedDict()  # request id -> output in the global tree
        self._evicted = 0  # outputs evicted but still in the global tree
        self._requests: dict[str, _Request] = {}

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int]) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already tracked by the suffix proposer")
        r = _Request(SuffixTree(self.max_depth))
        self._requests[request_id] = r
        self._extend(r, prompt_token_ids)
        r.num_prompt = len(r.tokens)

    def append(self, request_id: str, token_ids: Sequence[int]) -> None:
        self._extend(self._requests[request_id], token_ids)

    def propose(self, request_id: str, max_tokens: int) -> list[int]:
        r = self._requests[request_id]
        max_tokens = min(max_tokens, self.max_depth - 1)
        if max_tokens <= 0 or not r.tokens:
            return []
        best, best_score = self._draft(r.tree, r.tree.matches(r.cursor, r.tokens), max_tokens, own=True)
        if self._cached:
            if r.global_version != self.global_tree.version:  # the tree changed: rebuild the cursor
                r.global_cursor = self.global_tree.follow([], r.tokens[-self.max_depth:])
                r.global_version = self.global_tree.version
            tokens, score = self._draft(self.global_tree, r.global_cursor, max_tokens, own=False)
            if score > best_score:
                best = tokens
        return best

    def finish(self, request_id: str, keep_output: bool = True) -> None:
        r = self._requests.pop(request_id, None)
        if r is None or not keep_output or self.max_cached_requests == 0:
            return
        output = r.tokens[r.num_prompt:]
        if not output:
            return
        self._cached.pop(request_id, None)
        self._cached[request_id] = output
        self.global_tree.add([], output, 0)
        while 0 <= self.max_cached_requests < len(self._cached):
            self._cached.popitem(last=False)
            self._evicted += 1
        if self._evicted and self._evicted * 4 >= max(self.max_cached_requests, 1):
            version = self.global_tree.version  # versions keep rising: old cursors stay stale
            self.global_tree = SuffixTree(self.max_depth)
            self.global_tree.version = version
            for kept in self._cached.values():
                self.global_tree.add([], kept, 0)
            self._evicted = 0

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    @property
    def num_cached_requests(self) -> int:
        return len(self._cached)

    def _extend(self, r: _Request, new: Sequence[int]) -> None:
        start = len(r.tokens)
        r.tokens.extend(int(t) for t in new)
        if len(r.tokens) == start:
            return
        r.cursor = r.tree.add(r.cursor, r.tokens, start)
        if r.global_version == self.global_tree.version:  # keep the read-only cursor current
            r.global_cursor = self.global_tree.follow(r.global_cursor, r.tokens[start:])

    def _draft(self, tree: SuffixTree, entries: Cursor, max_tokens: int, own: bool) -> tuple[list[int], float]:
        """The continuation of the deepest usable match in ``tree``, with its score.
        In the request's own tree a leaf entry is the request's own, only occurrence."""
        room = self.max_depth - max_tokens  # deepest match that leaves room for max_tokens
        for node, depth in entries:  # deepest first
            if depth > room:
                continue
            if node.count == 1:  # a leaf's chain: one occurrence
                if own or node.pos + depth - node.depth >= len(node.seq):
                    continue
            elif not node.children:
                continue
            limit = min(max_tokens, math.floor(self.max_spec_factor * depth))
            if limit <= 0:
                return [], 0.0
            return tree.continuation(node, depth, limit, self.min_token_prob)
        return [], 0.0
