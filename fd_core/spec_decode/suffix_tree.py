"""A bounded-depth suffix trie with occurrence counts, leaves kept implicit.

Every substring of length <= ``max_depth`` of the inserted sequences is a
path from the root; a node's ``count`` is how many times its path occurred
(overlapping occurrences count), so a node's children say which tokens
followed its path and how often.

Memory: a path that occurred once is not spelled out node by node. A node
with ``count == 1`` is a *leaf*: it records its one occurrence (``seq`` and
``pos``, the index after its path in ``seq``) and stands for the whole chain
below it along ``seq[pos:]``. Nodes are materialised only where a second
occurrence arrives (``_promote``), so the trie holds O(sequence length +
repeated substrings) nodes, not O(length * max_depth).

A cursor is the list of ``(node, depth)`` entries for the suffixes of a
sequence (deepest first, at most ``max_depth``): ``depth`` is the suffix's
length and ``node`` the deepest materialised node on its path (a leaf when
``node.depth < depth``). Appending one token costs O(max_depth).

Who calls: ``fd_core.spec_decode.suffix.SuffixProposer`` only.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Cursor", "SuffixNode", "SuffixTree"]


class SuffixNode:
    __slots__ = ("children", "count", "depth", "seq", "pos")

    def __init__(self, depth: int, seq: Sequence[int], pos: int) -> None:
        self.children: dict[int, SuffixNode] = {}  # next token -> node (empty for a leaf)
        self.count = 1  # occurrences of this node's path
        self.depth = depth  # length of this node's path
        self.seq, self.pos = seq, pos  # an occurrence: the path is seq[pos - depth: pos]


Cursor = list[tuple[SuffixNode, int]]  # (deepest materialised node, suffix length), deepest first


class SuffixTree:
    """Substrings of up to ``max_depth`` tokens of the sequences added."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"suffix tree depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = SuffixNode(0, (), 0)
        self.root.count = 0
        self.num_nodes = 1
        self.version = 0  # bumped by every add: read-only cursors over this tree go stale

    def add(self, cursor: Cursor, seq: Sequence[int], start: int) -> Cursor:
        """Insert ``seq[start:]`` as the continuation of ``seq[:start]``, whose
        cursor is ``cursor`` (``[]`` when ``start == 0``); returns the cursor
        after it. ``seq`` is referenced, not copied: the caller only appends to it."""
        self.version += 1
        limit, root = self.max_depth, self.root
        for p in range(start, len(seq)):
            t = seq[p]
            nxt: Cursor = []
            for node, depth in (*cursor, (root, 0)):
                if depth >= limit:
                    continue
                node = self._settle(node, depth, seq, p - depth)
                if node.count == 1:  # our own leaf: the path grows implicitly
                    nxt.append((node, depth + 1))
                    continue
                child = node.children.get(t)
                if child is None:
                    node.children[t] = child = SuffixNode(depth + 1, seq, p + 1)
                    self.num_nodes += 1
                else:
                    if child.count == 1:
                        self._promote(child)
                    child.count += 1
                    child.seq, child.pos = seq, p + 1
                nxt.append((child, depth + 1))
            cursor = nxt
        return cursor

    def follow(self, cursor: Cursor, tokens: Sequence[int]) -> Cursor:
        """Match ``tokens`` as the continuation of ``cursor`` without inserting:
        the entries of the suffixes that are paths of the tree (deepest first)."""
        limit, root = self.max_depth, self.root
        for t in tokens:
            nxt: Cursor = []
            for node, depth in (*cursor, (root, 0)):
                if depth >= limit:
                    continue
                if node.count == 1:  # inside a leaf's chain
                    i = node.pos + depth - node.depth
                    if i < len(node.seq) and node.seq[i] == t:
                        nxt.append((node, depth + 1))
                    continue
                child = node.children.get(t)
                if child is not None:
                    nxt.append((child, depth + 1))
            cursor = nxt
        return cursor

    def matches(self, cursor: Cursor, seq: Sequence[int]) -> Cursor:
        """``cursor`` (of ``seq``, inserted in this tree) with every entry moved to
        the deepest materialised node of its path: the entries whose path
        occurred before are the ones at a node with ``count >= 2``."""
        end = len(seq)
        return [(self._settle(node, depth, seq, end - depth), depth) for node, depth in cursor]

    def continuation(self, node: SuffixNode, depth: int, max_tokens: int,
                     min_prob: float) -> tuple[list[int], float]:
        """The most likely path after the match ``(node, depth)``: at each step
        the most frequent child (ties: the smallest token id), while the path's
        probability (the product of child count / the children's total) stays
        >= ``min_prob``; inside a leaf the one occurrence's tokens (probability
        1). Returns (tokens, score), score = the sum of the path probabilities
        (the expected number of tokens a faithful drafter gets accepted)."""
        max_tokens = min(max_tokens, self.max_depth - depth)
        tokens: list[int] = []
        prob, score = 1.0, 0.0
        while len(tokens) < max_tokens:
            if node.count == 1 and node is not self.root:  # a leaf: its occurrence, to the end
                i = node.pos + depth - node.depth
                tail = list(node.seq[i: i + max_tokens - len(tokens)])
                return tokens + tail, score + prob * len(tail)
            if not node.children:
                break
            total = sum(c.count for c in node.children.values())
            token, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
            prob *= child.count / total
            if prob < min_prob:
                break
            tokens.append(token)
            score += prob
            node, depth = child, depth + 1
        return tokens, score

    def _settle(self, node: SuffixNode, depth: int, seq: Sequence[int], begin: int) -> SuffixNode:
        """Descend from ``node`` along ``seq[begin: begin + depth]`` (a path through
        ``node``) over the nodes materialised since the entry was made."""
        while node.depth < depth and node.count != 1:
            node = node.children[seq[begin + node.depth]]
        return node

    def _promote(self, leaf: SuffixNode) -> None:
        """A second occurrence reaches ``leaf``: materialise the first one's next
        node (a leaf itself) so the counts below stay exact."""
        i = leaf.pos
        if leaf.depth < self.max_depth and i < len(leaf.seq):
            leaf.children[leaf.seq[i]] = SuffixNode(leaf.depth + 1, leaf.seq, i + 1)
            self.num_nodes += 1
