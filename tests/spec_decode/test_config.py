"""--speculative-config: FastDeploy's keys parse; bad values and unsupported keys are refused by name."""

from __future__ import annotations

import json

import pytest

from fd_core.spec_decode import SpeculativeConfig, make_proposer, parse_speculative_config
from fd_core.spec_decode.ngram import NgramProposer
from fd_core.spec_decode.suffix import SuffixProposer


def test_fastdeploy_mtp_launch_line_parses() -> None:
    line = '{"method": "mtp", "num_speculative_tokens": 1, "model": "/models/ERNIE-4.5-21B-A3B-Paddle/mtp"}'
    c = parse_speculative_config(line)
    assert c == SpeculativeConfig(method="mtp", num_speculative_tokens=1, model="/models/ERNIE-4.5-21B-A3B-Paddle/mtp")
    assert c is not None and c.is_model_drafter


def test_json_dict_and_config_give_the_same_object() -> None:
    d = {"method": "ngram", "num_speculative_tokens": 4, "max_ngram_size": 3, "min_ngram_size": 1}
    assert parse_speculative_config(json.dumps(d)) == parse_speculative_config(d)
    c = parse_speculative_config(d)
    assert parse_speculative_config(c) is c


def test_fastdeploy_spelling_of_ngram() -> None:
    c = parse_speculative_config({"method": "ngram_match", "num_speculative_tokens": 2})
    assert c is not None and c.method == "ngram"


def test_off() -> None:
    assert parse_speculative_config(None) is None
    assert parse_speculative_config("") is None
    assert parse_speculative_config({"method": None}) is None


def test_suffix_keys() -> None:
    c = parse_speculative_config({
        "method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 32,
        "suffix_decoding_max_cached_requests": -1, "suffix_decoding_max_spec_factor": 2.0,
        "suffix_decoding_min_token_prob": 0.2,
    })
    assert c is not None and c.suffix_decoding_max_cached_requests == -1


@pytest.mark.parametrize("value, words", [
    ({"method": "medusa"}, ["'medusa'", "mtp, ngram, suffix"]),
    ({"method": "hybrid_mtp_ngram"}, ["'hybrid_mtp_ngram'", "not supported"]),
    ({"method": "ngram", "num_speculative_tokens": 0}, ["num_speculative_tokens = 0", "[1, 16]"]),
    ({"method": "ngram", "num_speculative_tokens": "4"}, ["num_speculative_tokens = '4'"]),
    ({"method": "ngram", "num_speculative_tokens": True}, ["num_speculative_tokens = True"]),
    ({"method": "ngram", "min_ngram_size": 4, "max_ngram_size": 2}, ["max_ngram_size = 2", "min_ngram_size"]),
    ({"method": "ngram", "model": "/x"}, ["model", "only used by method 'mtp'"]),
    ({"method": "suffix", "suffix_decoding_min_token_prob": 1.5}, ["suffix_decoding_min_token_prob = 1.5"]),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": 0}, ["suffix_decoding_max_spec_factor = 0"]),
    ({"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 8},
     ["suffix_decoding_max_tree_depth = 8"]),
    ({"method": "ngram", "prompt_lookup_max": 4}, ["'prompt_lookup_max'", "'max_ngram_size'"]),
    ({"method": "ngram", "bogus": 1}, ["unknown speculative config key 'bogus'"]),
    ({"method": "mtp", "mtp_strategy": "with_ngram"}, ["'mtp_strategy'", "'with_ngram'", "not supported"]),
    ({"method": "mtp", "verify_window": 4}, ["'verify_window'", "verifies exactly"]),
    ({"method": "mtp", "enable_draft_logprob": True}, ["'enable_draft_logprob'"]),
    ({"num_speculative_tokens": 2}, ["no 'method'"]),
    ("{not json", ["not valid JSON"]),
    ("[1, 2]", ["expected a JSON object"]),
])
def test_refusals_name_the_key_and_what_was_expected(value: object, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        parse_speculative_config(value)  # type: ignore[arg-type]
    for w in words:
        assert w in str(err.value), str(err.value)


def test_fastdeploy_defaults_of_unsupported_keys_are_accepted() -> None:
    """A config dumped by FastDeploy (its defaults for what we do not implement) parses."""
    c = parse_speculative_config({
        "method": "mtp", "num_speculative_tokens": 1, "mtp_strategy": "default", "max_candidate_len": 5,
        "verify_window": 2, "num_gpu_block_expand_ratio": 1, "benchmark_mode": False,
        "enable_draft_logprob": False, "model_type": "main",
    })
    assert c == SpeculativeConfig(method="mtp")


def test_num_model_steps_raises_k_like_fastdeploy() -> None:
    c = parse_speculative_config({"method": "mtp", "num_speculative_tokens": 1, "num_model_steps": 3})
    assert c is not None and c.num_speculative_tokens == 3 and c.num_model_steps == 3
    with pytest.raises(ValueError, match="num_model_steps 3 exceeds num_speculative_tokens 1"):
        SpeculativeConfig(method="mtp", num_speculative_tokens=1, num_model_steps=3)


def test_make_proposer() -> None:
    assert isinstance(make_proposer(SpeculativeConfig("ngram")), NgramProposer)
    assert isinstance(make_proposer(SpeculativeConfig("suffix")), SuffixProposer)
    with pytest.raises(ValueError, match="model runner"):
        make_proposer(SpeculativeConfig("mtp"))


def test_num_model_steps_other_than_one_or_k_is_refused_naming_it():
    from fd_core.spec_decode.config import parse_speculative_config

    assert parse_speculative_config({"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 3})
    with pytest.raises(ValueError, match="num_model_steps 2: the MTP block runs once per draft"):
        parse_speculative_config({"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 2})
