"""Bad-word bans per step in time independent of how many words a request names.

A bad word ``w`` bans its last token at a step when the output so far ends
with ``w[:-1]``; a one-token word is banned at every step (vLLM v1). The
straightforward check compares every word with the output's tail at every
step: O(total word tokens) per step, paid by every request in the batch.

``BadWordsMatcher`` compiles a request's words once into an Aho-Corasick
automaton over the prefixes ``w[:-1]``. It reads each output token once
(amortised O(1) per token) and keeps the automaton's node: the longest
output tail that is the start of some prefix. The words whose prefix ends
the output are that node and its chain of dictionary links, each of which
holds at least one banned token, so a step costs O(new tokens + tokens it
bans), whatever the number and length of the words. Building is O(total
word tokens), once per request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice

import numpy as np

__all__ = ["BadWordsMatcher"]


class BadWordsMatcher:
    """One request's bad words; ``banned(output)`` at each step.

    ``output`` is expected to only grow between calls (the engine appends
    kept tokens); a shorter output, or one whose last read token changed,
    makes the matcher re-read the output's tail (O(longest word)).
    """

    def __init__(self, words: Iterable[Sequence[int]]) -> None:
        always: set[int] = set()
        # trie over the prefixes w[:-1] of multi-token words; node 0 is the empty prefix
        children: list[dict[int, int]] = [{}]
        ends: dict[int, set[int]] = {}  # node -> last tokens of the words whose prefix it is
        depth = 0  # longest prefix
        for word in words:
            if len(word) == 0:
                continue
            if len(word) == 1:
                always.add(int(word[0]))
                continue
            node = 0
            for token in word[:-1]:
                nxt = children[node].get(token)
                if nxt is None:
                    nxt = len(children)
                    children.append({})
                    children[node][int(token)] = nxt
                node = nxt
            ends.setdefault(node, set()).add(int(word[-1]))
            depth = max(depth, len(word) - 1)
        fail = [0] * len(children)  # node -> node of its longest proper suffix
        link = [0] * len(children)  # node -> nearest proper-suffix node in ends (0: none)
        queue = deque(children[0].values())
        while queue:  # breadth first: a node's suffixes are shorter, so already linked
            node = queue.popleft()
            for token, child in children[node].items():
                f = fail[node]
                while f and token not in children[f]:
                    f = fail[f]
                target = children[f].get(token, 0)
                fail[child] = target
                link[child] = target if target in ends else link[target]
                queue.append(child)
        self._children = children
        self._fail = fail
        self._link = link
        self._ends = {node: np.array(sorted(toks), np.int64) for node, toks in ends.items()}
        self._always = np.array(sorted(always), np.int64)
        self._depth = depth
        self._node = 0  # automaton node after the output read so far
        self._read = 0  # output tokens read so far
        self._last: int | None = None  # the last token read (to notice a rewritten output)

    @property
    def num_nodes(self) -> int:
        """Trie nodes (1 + distinct non-empty prefixes of the words' prefixes)."""
        return len(self._children)

    @property
    def has_multi_token_words(self) -> bool:
        return len(self._children) > 1

    def banned(self, output: Sequence[int]) -> np.ndarray:
        """Token ids (int64, possibly repeated) banned after ``output``."""
        if len(self._children) == 1:
            return self._always
        n = len(output)
        if n < self._read or (self._read and output[self._read - 1] != self._last):
            self._node, self._read = 0, max(0, n - self._depth)  # rewritten: re-read the tail
        node, children, fail = self._node, self._children, self._fail
        for token in islice(output, self._read, None):
            while node and token not in children[node]:
                node = fail[node]
            node = children[node].get(token, 0)
        if n > self._read:
            self._node, self._read, self._last = node, n, output[n - 1]
        found = node if node in self._ends else self._link[node]
        if not found:
            return self._always
        parts = [self._always]
        while found:
            parts.append(self._ends[found])
            found = self._link[found]
        return np.concatenate(parts)
