"""The policies: round robin, power of two, least loaded, cache affinity with bounded load."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fd_core.router.policy import BLOCK_CHARS, Picker, PrefixTable, prefix_keys
from fd_core.router.proxy import prompt_text
from fd_core.router.registry import Instance


def _insts(*loads: int) -> list[Instance]:
    return [Instance(f"http://h:{8000 + i}", in_flight=load) for i, load in enumerate(loads)]


def test_round_robin_takes_each_in_turn_whatever_the_load():
    insts = _insts(5, 0, 9)
    picker = Picker("round_robin")
    assert [picker.pick(insts).url for _ in range(6)] == [i.url for i in insts] * 2


def test_least_loaded_takes_the_lowest_load_and_breaks_ties_by_requests_served():
    insts = _insts(3, 1, 2)
    assert Picker("request_num").pick(insts) is insts[1]
    a, b = _insts(0, 0)
    a.served = 5
    assert Picker("least_loaded").pick([a, b]) is b


def test_load_is_the_routers_count_plus_the_work_of_other_clients():
    inst = Instance("http://h:1", in_flight=1, running=3, waiting=2, external=4)
    assert inst.load == 5
    inst.in_flight = 9
    assert inst.load == 13


def test_power_of_two_never_picks_the_most_loaded_of_two_or_more():
    insts = _insts(0, 5, 9)
    picker = Picker("power_of_two", rng=random.Random(0))
    picks = Counter(picker.pick(insts).url for _ in range(300))
    assert insts[2].url not in picks
    assert picks[insts[0].url] > picks[insts[1].url] > 0


def test_random_uses_every_instance():
    insts = _insts(0, 0, 0)
    picker = Picker("random", rng=random.Random(1))
    picks = Counter(picker.pick(insts).url for _ in range(300))
    assert set(picks) == {i.url for i in insts}


def test_prefix_keys_are_chained_over_full_blocks():
    text = "a" * BLOCK_CHARS * 3 + "tail"
    keys = prefix_keys(text, 10_000)
    assert len(keys) == 3 and len(set(keys)) == 3  # the same block text, different parents
    assert prefix_keys("a" * BLOCK_CHARS * 2 + "b" * BLOCK_CHARS, 10_000)[:2] == keys[:2]
    assert prefix_keys(text, 2 * BLOCK_CHARS) == keys[:2]  # cut at max_chars
    assert prefix_keys("short", 10_000) == []


def test_prefix_table_finds_the_longest_match_among_allowed_instances():
    table = PrefixTable()
    keys = prefix_keys("x" * BLOCK_CHARS * 4, 10_000)
    table.record(keys[:2], "http://a:1")
    table.record(keys, "http://b:1")
    assert table.longest_match(keys, {"http://a:1", "http://b:1"}) == ("http://b:1", 4)
    table.record(keys[:2], "http://a:1")  # a took the first two blocks back
    assert table.longest_match(keys, {"http://a:1"}) == ("http://a:1", 2)
    assert table.longest_match(keys, set()) == (None, 0)


def test_prefix_table_is_bounded():
    table = PrefixTable(capacity=10)
    table.record(prefix_keys("y" * BLOCK_CHARS * 25, 100_000), "http://a:1")
    assert len(table) == 10


def _shared(i: int) -> list[bytes]:
    system = f"You are a helpful assistant for shop {i % 4}. " * 20
    return prefix_keys(system + f"question {i}", 4096)


def _route(picker: Picker, insts: list[Instance], keys: list[bytes]) -> str:
    chosen = picker.pick(insts, keys)
    chosen.served += 1  # as the proxy counts it
    return chosen.url


def test_cache_aware_sends_a_shared_prefix_to_the_same_instance():
    insts = _insts(0, 0, 0, 0)
    picker = Picker("cache_aware", balance_abs=2, balance_rel=0.25)
    first = {g: _route(picker, insts, _shared(g)) for g in range(4)}
    assert len(set(first.values())) == 4  # unseen prefixes go to the least loaded (then least served)
    for i in range(4, 40):
        assert _route(picker, insts, _shared(i)) == first[i % 4]
    assert picker.affinity_hits == 36


def test_cache_aware_leaves_an_overloaded_instance_for_the_least_loaded():
    insts = _insts(0, 0, 0)
    picker = Picker("cache_aware", balance_abs=1, balance_rel=0.0)
    home = picker.pick(insts, _shared(0))
    home.in_flight = 10  # far above the mean
    other = picker.pick(insts, _shared(0))
    assert other is not home and other.in_flight == 0
    home.in_flight = 0
    assert picker.pick(insts, _shared(0)) in insts  # still answers


def test_cache_aware_without_a_prefix_is_least_loaded():
    insts = _insts(4, 1, 3)
    assert Picker("cache_aware").pick(insts, []) is insts[1]


def test_picking_from_nothing_is_an_error():
    with pytest.raises(ValueError, match="no instance"):
        Picker("round_robin").pick([])


def test_prompt_text_of_chat_and_completion_requests():
    chat = {"messages": [{"role": "system", "content": "S"},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}]}
    assert prompt_text(chat) == "system\x1fS\x1euser\x1fhi\x1e"
    assert prompt_text({"prompt": "abc"}) == "abc"
    assert prompt_text({"prompt": ["abc", "def"]}) == "abc"
    assert prompt_text({"prompt": [1, 2, 3]}) == "1 2 3"
    assert prompt_text({"prompt": [[1, 2], [3]]}) == "1 2"
    assert prompt_text(None) == "" and prompt_text({"prompt": 5}) == ""
