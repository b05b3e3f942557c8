"""Benchmark datasets: random lengths, shared prefixes, ShareGPT parsing."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from fd_core.benchmarks.datasets import (
    TokenSource,
    add_dataset_args,
    random_requests,
    sample_requests,
    shared_prefix_requests,
    sharegpt_requests,
)


@pytest.fixture(scope="module")
def tokenizer(checkpoint_factory):
    from fd_core.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(checkpoint_factory("tiny-dense"))


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_dataset_args(p)
    return p.parse_args(list(argv))


def test_random_token_ids_lengths_within_range_and_prefix_shared():
    src = TokenSource(np.random.default_rng(0), vocab_size=500)
    reqs = random_requests(src, 50, input_len=40, output_len=10, range_ratio=0.5, prefix_len=8)
    prefix = reqs[0].prompt[:8]
    for r in reqs:
        assert isinstance(r.prompt, list) and r.prompt[:8] == prefix
        assert r.prompt_len == len(r.prompt)
        assert 20 <= len(r.prompt) - 8 <= 60
        assert 5 <= r.output_len <= 15
        assert all(100 <= t < 500 for t in r.prompt)
    assert len({len(r.prompt) for r in reqs}) > 5  # lengths really vary
    assert len({tuple(r.prompt[8:]) for r in reqs}) == 50


def test_zero_range_ratio_gives_exact_lengths():
    reqs = random_requests(TokenSource(np.random.default_rng(1)), 5, 12, 7)
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(12, 7)] * 5


def test_random_text_prompts_encode_to_their_recorded_length(tokenizer):
    src = TokenSource(np.random.default_rng(0), tokenizer)
    special = set(tokenizer.all_special_ids)
    assert not special & set(src.ids.tolist())
    for r in random_requests(src, 10, input_len=48, output_len=4, range_ratio=0.25, prefix_len=16):
        assert isinstance(r.prompt, str)
        assert r.prompt_len == len(tokenizer.encode(r.prompt))
        assert abs(r.prompt_len - 16 - 48) <= 12 + 2


def test_shared_prefix_groups(tokenizer):
    src = TokenSource(np.random.default_rng(0))
    reqs = shared_prefix_requests(src, 6, prefix_len=32, question_len=8, output_len=4, num_groups=2)
    assert reqs[0].prompt[:32] == reqs[2].prompt[:32] == reqs[4].prompt[:32]
    assert reqs[1].prompt[:32] == reqs[3].prompt[:32] == reqs[5].prompt[:32]
    assert reqs[0].prompt[:32] != reqs[1].prompt[:32]
    assert reqs[0].prompt[32:] != reqs[2].prompt[32:]
    texts = shared_prefix_requests(TokenSource(np.random.default_rng(0), tokenizer), 4, 32, 8, 4)
    ids = [tokenizer.encode(r.prompt) for r in texts]
    assert all(i[:30] == ids[0][:30] for i in ids)  # the text prefix is the same prompt prefix


def _sharegpt_file(tmp_path):
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": "What is the capital of France? Tell me."},
                                      {"from": "gpt", "value": "The capital of France is Paris, a city."}]},
        {"id": "b", "conversations": [{"from": "system", "value": "be brief"},
                                      {"from": "human", "value": "Name three primary colours for me."},
                                      {"from": "gpt", "value": "Red, yellow and blue are the primaries."}]},
        {"id": "c", "conversations": [{"from": "human", "value": "only a question"}]},
        {"id": "d", "conversations": []},
        "not an entry",
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_sharegpt_uses_first_exchange(tmp_path, tokenizer):
    path = _sharegpt_file(tmp_path)
    reqs = sharegpt_requests(path, 2, np.random.default_rng(0), tokenizer)
    by_prompt = {r.prompt: r for r in reqs}
    assert set(by_prompt) == {"What is the capital of France? Tell me.",
                              "Name three primary colours for me."}
    reply = "The capital of France is Paris, a city."
    r = by_prompt["What is the capital of France? Tell me."]
    assert r.output_len == len(tokenizer.encode(reply))
    assert r.prompt_len == len(tokenizer.encode(r.prompt))
    fixed = sharegpt_requests(path, 2, np.random.default_rng(0), None, output_len=7)
    assert {(r.prompt_len, r.output_len) for r in fixed} == {(None, 7)}


def test_sharegpt_errors_name_the_fix(tmp_path):
    path = _sharegpt_file(tmp_path)
    with pytest.raises(ValueError, match="only 2 usable conversations"):
        sharegpt_requests(path, 3, np.random.default_rng(0), None, output_len=5)
    with pytest.raises(ValueError, match="--tokenizer"):
        sharegpt_requests(path, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="--dataset-path"):
        sample_requests(_args("--dataset-name", "sharegpt"))


def test_sample_requests_is_seeded_and_validates():
    argv = ("--num-prompts", "4", "--random-input-len", "10", "--random-range-ratio", "0.5")
    assert sample_requests(_args(*argv)) == sample_requests(_args(*argv))
    assert sample_requests(_args(*argv)) != sample_requests(_args(*argv, "--seed", "1"))
    with pytest.raises(ValueError, match="--random-range-ratio"):
        sample_requests(_args("--random-range-ratio", "1.5"))
    with pytest.raises(ValueError, match="--num-prompts"):
        sample_requests(_args("--num-prompts", "0"))


def test_prompt_and_output_lengths_come_from_independent_ranges():
    src = TokenSource(np.random.default_rng(0), vocab_size=500)
    reqs = random_requests(src, 60, input_len=1, output_len=1, input_range=(5, 9), output_range=(100, 120))
    assert {len(r.prompt) for r in reqs} == set(range(5, 10))  # both ends reached in 60 draws
    assert all(100 <= r.output_len <= 120 for r in reqs) and len({r.output_len for r in reqs}) > 5
    # a range on one side, the ratio on the other
    mixed = random_requests(src, 40, input_len=20, output_len=1, range_ratio=0.5, output_range=(7, 7))
    assert all(10 <= len(r.prompt) <= 30 for r in mixed) and {r.output_len for r in mixed} == {7}
    shared = shared_prefix_requests(src, 20, prefix_len=4, question_len=1, output_len=1,
                                    question_range=(2, 3), output_range=(8, 9))
    assert all(6 <= len(r.prompt) <= 7 and 8 <= r.output_len <= 9 for r in shared)
    with pytest.raises(ValueError, match="--random-input-range"):
        random_requests(src, 2, 1, 1, input_range=(9, 5))


def test_range_flags_parse_and_refuse_what_would_be_ignored():
    args = _args("--num-prompts", "30", "--random-input-range", "3:5", "--random-output-range", "11")
    assert (args.random_input_range, args.random_output_range) == ((3, 5), (11, 11))
    reqs = sample_requests(args)
    assert all(3 <= r.prompt_len <= 5 and r.output_len == 11 for r in reqs)
    assert sample_requests(args) == reqs  # seeded
    assert {r.prompt_len for r in sample_requests(_args("--num-prompts", "2"))} == {1024}  # default
    with pytest.raises(ValueError, match="exclude each other"):
        sample_requests(_args("--random-output-len", "4", "--random-output-range", "2:3"))
    with pytest.raises(ValueError, match="--random-range-ratio"):
        sample_requests(_args("--random-input-range", "2:3", "--random-output-range", "2:3",
                              "--random-range-ratio", "0.2"))
    for bad in ("5:4", "0:2", "-3:2", "x", "2.5:4", "2:"):
        with pytest.raises(SystemExit):
            _args("--random-input-range", bad)


def test_keep_ids_gives_token_id_prompts_with_a_tokenizer(tokenizer):
    src = TokenSource(np.random.default_rng(0), tokenizer, keep_ids=True)
    for r in random_requests(src, 5, input_len=1, output_len=2, input_range=(6, 10)):
        assert isinstance(r.prompt, list) and r.prompt_len == len(r.prompt)
        assert set(r.prompt) <= set(src.ids.tolist())
