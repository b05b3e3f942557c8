"""The suffix tree and the suffix-decoding proposer."""

from __future__ import annotations

import random

import pytest

from fd_core.spec_decode.suffix import SuffixProposer
from fd_core.spec_decode.suffix_tree import SuffixNode, SuffixTree


def substring_counts(seqs: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + depth) + 1):
                counts[tuple(s[i:j])] = counts.get(tuple(s[i:j]), 0) + 1
    return counts


def tree_counts(tree: SuffixTree) -> dict[tuple[int, ...], int]:
    """Every path's count, implicit leaf chains spelled out."""
    out: dict[tuple[int, ...], int] = {}
    stack: list[tuple[tuple[int, ...], SuffixNode]] = [((), tree.root)]
    while stack:
        path, node = stack.pop()
        if node.count == 1:  # a leaf: its occurrence continues, count 1, up to max_depth
            tail = list(node.seq[node.pos: node.pos + tree.max_depth - node.depth])
            for i in range(len(tail)):
                out[path + tuple(tail[: i + 1])] = 1
            assert not node.children
        for t, child in node.children.items():
            out[path + (t,)] = child.count
            stack.append((path + (t,), child))
    return out


@pytest.mark.parametrize("alphabet, depth", [(2, 4), (3, 5), (4, 8), (50, 6)])
def test_tree_counts_every_bounded_substring_incrementally(alphabet: int, depth: int) -> None:
    rng = random.Random(alphabet * 100 + depth)
    seqs = [[rng.randrange(alphabet) for _ in range(rng.randrange(1, 60))] for _ in range(6)]
    seqs.append([1] * 30)  # a run: every suffix overlaps the others
    tree = SuffixTree(depth)
    held: list[list[int]] = []
    for s in seqs:
        seq: list[int] = []
        held.append(seq)
        cursor: list = []
        i = 0
        while i < len(s):  # in pieces: the cursor carries the suffixes across appends
            step = rng.randrange(1, 5)
            seq.extend(s[i: i + step])
            cursor = tree.add(cursor, seq, i)
            i += step
        assert tree_counts(tree) == substring_counts(held, depth)


def test_leaves_keep_the_tree_small() -> None:
    rng = random.Random(3)
    seq = [rng.randrange(100000) for _ in range(5000)]
    tree = SuffixTree(64)
    tree.add([], seq, 0)
    assert tree.num_nodes < 2 * len(seq)  # a trie spelled out would hold ~64 nodes per token


def test_continuation_follows_the_most_frequent_child_until_unlikely() -> None:
    tree = SuffixTree(8)
    for s in ([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9, 9]):
        tree.add([], s, 0)
    node = tree.root.children[1]
    tokens, score = tree.continuation(node, 1, 5, 0.1)
    # after 1: 2 (4/4); after 1 2: 3 (3/4); after 1 2 3: 4 (2/3) -> path probs 1, .75, .5
    assert tokens == [2, 3, 4] and abs(score - 2.25) < 1e-12
    assert tree.continuation(node, 1, 5, 0.6)[0] == [2, 3]  # stops once the path probability < 0.6
    assert tree.continuation(node, 1, 1, 0.0)[0] == [2]
    leaf = tree.root.children[9]  # "9" occurred twice ("9 9"): materialised; "9 9" once: a leaf
    assert leaf.count == 2 and tree.continuation(leaf, 1, 5, 0.0)[0] == [9]


def test_proposes_from_the_request_own_history() -> None:
    p = SuffixProposer(max_depth=16, max_cached_requests=0, max_spec_factor=4.0, min_token_prob=0.0)
    p.add_request("r", [7, 1, 2, 3, 4, 5, 8, 1, 2])
    assert p.propose("r", 3) == [3, 4, 5]
    p.append("r", [3])
    assert p.propose("r", 2) == [4, 5]
    assert p.propose("r", 0) == []


def test_spec_factor_bounds_the_draft_by_the_match_length() -> None:
    p = SuffixProposer(max_depth=16, max_cached_requests=0, max_spec_factor=1.0, min_token_prob=0.0)
    p.add_request("r", [1, 2, 3, 4, 5, 6, 9, 2])  # the match is "2" (length 1)
    assert p.propose("r", 4) == [3]


def test_long_repetition_still_leaves_room_for_the_continuation() -> None:
    """A match deeper than max_depth - k is not used: the continuation keeps k tokens of room."""
    block = list(range(100, 140))
    p = SuffixProposer(max_depth=24, max_cached_requests=0, max_spec_factor=1.0, min_token_prob=0.1)
    p.add_request("r", block + block[:30])
    assert p.propose("r", 4) == block[30:34]


def test_global_tree_serves_later_requests_and_is_bounded() -> None:
    p = SuffixProposer(max_depth=16, max_cached_requests=2, max_spec_factor=2.0, min_token_prob=0.1)
    p.add_request("a", [0, 0])
    p.append("a", [50, 51, 52, 53, 54])
    p.finish("a")  # its output (not its prompt) enters the global tree
    assert p.num_cached_requests == 1
    p.add_request("b", [9, 50, 51])
    assert p.propose("b", 3) == [52, 53, 54]
    p.append("b", [52])  # the read-only cursor follows the history
    assert p.propose("b", 2) == [53, 54]
    for name, out in (("c", [60, 61]), ("d", [70, 71])):
        p.add_request(name, [1])
        p.append(name, out)
        p.finish(name)
    assert p.num_cached_requests == 2  # "a" was evicted: the oldest goes first
    p.add_request("e", [50, 51])
    assert p.propose("e", 3) == []
    p.add_request("f", [60])
    assert p.propose("f", 1) == [61]


def test_aborted_output_is_not_cached() -> None:
    p = SuffixProposer(max_depth=8)
    p.add_request("a", [1])
    p.append("a", [5, 6, 7])
    p.finish("a", keep_output=False)
    assert p.num_cached_requests == 0 and p.num_requests == 0


def test_own_tree_beats_global_on_ties_and_higher_score_wins() -> None:
    p = SuffixProposer(max_depth=16, max_cached_requests=10, max_spec_factor=4.0, min_token_prob=0.0)
    for i in range(3):  # three earlier outputs all continue "5 6" with 7
        p.add_request(f"g{i}", [0])
        p.append(f"g{i}", [5, 6, 7, 8])
        p.finish(f"g{i}")
    p.add_request("r", [5, 6, 1, 5, 6, 2, 5, 6])  # own history: 1 then 2 after "5 6" (each 1/2)
    assert p.propose("r", 2) == [7, 8]  # global path probs 1, 1 beat own .5


def brute_force_draft(tokens: list[int], depth_limit: int, k: int, factor: float, min_prob: float) -> list[int]:
    """The proposer's definition for one history (own tree only), by scanning."""
    def followers(pattern: list[int]) -> dict[int, int]:
        n = len(pattern)
        out: dict[int, int] = {}
        if n + 1 > depth_limit:
            return out
        for s in range(len(tokens) - n):
            if tokens[s: s + n] == pattern:
                out[tokens[s + n]] = out.get(tokens[s + n], 0) + 1
        return out

    room = depth_limit - k
    for m in range(min(room, len(tokens) - 1), 0, -1):
        pattern = tokens[len(tokens) - m:]
        if not followers(pattern):
            continue
        limit, prob = min(k, int(factor * m)), 1.0
        draft: list[int] = []
        while len(draft) < limit:
            f = followers(pattern + draft)
            if not f:
                break
            token = max(f, key=lambda t: (f[t], -t))
            prob *= f[token] / sum(f.values())
            if prob < min_prob:
                break
            draft.append(token)
        return draft
    return []


@pytest.mark.parametrize("alphabet", [2, 3, 6])
def test_own_tree_drafts_match_the_definition(alphabet: int) -> None:
    rng = random.Random(alphabet)
    depth, k = 10, 3
    p = SuffixProposer(max_depth=depth, max_cached_requests=0, max_spec_factor=1.0, min_token_prob=0.2)
    history = [rng.randrange(alphabet) for _ in range(3)]
    p.add_request("r", history)
    for _ in range(150):
        assert p.propose("r", k) == brute_force_draft(history, depth, k, 1.0, 0.2), history
        new = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
        history.extend(new)
        p.append("r", new)
