"""The n-gram proposer: longest match first, most recent occurrence, incremental index."""

from __future__ import annotations

import random

import pytest

from fd_core.spec_decode.ngram import NgramProposer


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The definition, by scanning: longest n first, latest earlier occurrence."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        pattern = tokens[size - n:]
        for start in range(size - n - 1, -1, -1):
            if tokens[start: start + n] == pattern:
                out = list(tokens)
                for i in range(k):  # an overlapping copy: reads on into what it drafted
                    out.append(out[start + n + i])
                return out[size:]
    return []


def test_proposes_the_continuation_of_the_match() -> None:
    p = NgramProposer(2, 3)
    p.add_request("r", [10, 11, 12, 13, 14, 10, 11, 12])
    assert p.propose("r", 2) == [13, 14]
    # past the end of the history the copy reads on into its own draft (period 5)
    assert p.propose("r", 10) == [13, 14, 10, 11, 12, 13, 14, 10, 11, 12]
    assert p.propose("r", 0) == []


def test_a_short_loop_drafts_the_full_length() -> None:
    p = NgramProposer(2, 3)
    p.add_request("r", [5, 9, 9, 9])  # a one-token loop: the latest "9 9" ends one before the end
    assert p.propose("r", 4) == [9, 9, 9, 9]
    p.add_request("s", [1, 7, 8, 7, 8])  # period 2
    assert p.propose("s", 5) == [7, 8, 7, 8, 7]


def test_longest_ngram_wins_over_a_more_recent_shorter_one() -> None:
    # "7 8" occurs most recently before 5, but "6 7 8" (longer) occurs earlier before 1
    p = NgramProposer(2, 3)
    p.add_request("r", [6, 7, 8, 1, 9, 7, 8, 5, 6, 7, 8])
    assert p.propose("r", 1) == [1]


def test_most_recent_occurrence_of_the_same_ngram() -> None:
    p = NgramProposer(2, 2)
    p.add_request("r", [1, 2, 3, 1, 2, 4, 1, 2])
    assert p.propose("r", 1) == [4]


def test_no_match_proposes_nothing_and_min_size_is_respected() -> None:
    p = NgramProposer(2, 4)
    p.add_request("r", [1, 2, 3, 4, 5])
    assert p.propose("r", 3) == []
    p.add_request("s", [1, 2, 3, 1])  # only a 1-gram match: below min_ngram_size 2
    assert p.propose("s", 3) == []
    q = NgramProposer(1, 4)
    q.add_request("s", [1, 2, 3, 1])
    assert q.propose("s", 3) == [2, 3, 1]


def test_repetition_run_overlapping_the_query() -> None:
    p = NgramProposer(2, 3)
    p.add_request("r", [5, 5, 5, 5])
    # latest earlier "5 5 5" ends at position 2: the continuation is the last 5, read on as a loop
    assert p.propose("r", 3) == [5, 5, 5]


def test_appending_gives_the_same_answers_as_building_at_once() -> None:
    rng = random.Random(7)
    tokens = [rng.randrange(6) for _ in range(400)]
    inc = NgramProposer(2, 4)
    inc.add_request("r", tokens[:5])
    pos = 5
    while pos < len(tokens):
        step = rng.randrange(1, 4)
        inc.append("r", tokens[pos: pos + step])
        pos += step
        whole = NgramProposer(2, 4)
        whole.add_request("w", tokens[:pos])
        expected = brute_force(tokens[:pos], 2, 4, 3)
        assert inc.propose("r", 3) == whole.propose("w", 3) == expected, pos


def test_requests_are_independent_and_finish_forgets() -> None:
    p = NgramProposer(2, 2)
    p.add_request("a", [1, 2, 3, 1, 2])
    p.add_request("b", [1, 2])
    assert p.propose("a", 1) == [3] and p.propose("b", 1) == []
    with pytest.raises(ValueError, match="already tracked"):
        p.add_request("a", [])
    p.finish("a")
    assert p.num_requests == 1
    with pytest.raises(KeyError):
        p.propose("a", 1)


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match="min 3, max 2"):
        NgramProposer(3, 2)
