"""SamplingParams' FastDeploy fields: reasoning_max_tokens, logits_processors_args,
temp_scaled_logprobs, top_p_normalized_logprobs and the flat bad_words_token_ids."""

from __future__ import annotations

import pytest

from fd_core.sampling.params import SamplingParams


def test_defaults_are_off():
    p = SamplingParams()
    assert p.reasoning_max_tokens is None and p.logits_processors_args is None
    assert p.temp_scaled_logprobs is False and p.top_p_normalized_logprobs is False


def test_flat_bad_words_token_ids_are_one_token_words():
    assert SamplingParams(bad_words_token_ids=[5, 9]).bad_words_token_ids == [[5], [9]]
    assert SamplingParams(bad_words_token_ids=[5, [7, 8]]).bad_words_token_ids == [[5], [7, 8]]
    assert SamplingParams(bad_words_token_ids=[]).bad_words_token_ids == []


def test_reasoning_max_tokens_bounds():
    assert SamplingParams(reasoning_max_tokens=16, max_tokens=16).reasoning_max_tokens == 16
    assert SamplingParams(reasoning_max_tokens=10_000, max_tokens=None).reasoning_max_tokens == 10_000
    with pytest.raises(ValueError, match="reasoning_max_tokens must be <= max_tokens, got "
                                         "reasoning_max_tokens=17 and max_tokens=16"):
        SamplingParams(reasoning_max_tokens=17, max_tokens=16)


def test_logits_processors_args_are_copied_and_cloned_deeply():
    args = {"logit_bias": {"5": 1.0}}
    p = SamplingParams(logits_processors_args=args)
    args["other"] = 1
    assert p.logits_processors_args == {"logit_bias": {"5": 1.0}}
    c = p.clone()
    c.logits_processors_args["logit_bias"]["6"] = 2.0  # type: ignore[index]
    assert p.logits_processors_args == {"logit_bias": {"5": 1.0}}


@pytest.mark.parametrize("field", ["temp_scaled_logprobs", "top_p_normalized_logprobs"])
def test_logprob_flags_are_bools(field):
    assert getattr(SamplingParams(**{field: True}), field) is True
    with pytest.raises(ValueError, match=f"{field} must be a bool, got 1"):
        SamplingParams(**{field: 1})


def test_bad_words_are_bounded_per_request():
    from fd_core.sampling.params import MAX_BAD_WORDS

    SamplingParams(bad_words=[f"w{i}" for i in range(MAX_BAD_WORDS)])
    with pytest.raises(ValueError, match=r"bad_words holds 1025 entries; at most 1024"):
        SamplingParams(bad_words=[f"w{i}" for i in range(MAX_BAD_WORDS + 1)])
    with pytest.raises(ValueError, match=r"bad_words_token_ids holds 2000 entries; at most 1024"):
        SamplingParams(bad_words_token_ids=list(range(2000)))


def test_bad_word_variants_are_deduplicated_in_order():
    from fd_core.engine.frontend import tokenize_bad_words

    class Tok:
        def encode(self, text):
            return [ord(c) for c in text.strip()]  # " w" and "w" tokenize alike

    assert tokenize_bad_words(Tok(), ["ab", "c", " ab", "c"]) == [[97, 98], [99]]


def test_stop_lists_are_bounded_per_request():
    from fd_core.sampling.params import MAX_STOP

    SamplingParams(stop=[f"s{i}" for i in range(MAX_STOP)], stop_token_ids=list(range(1024)))
    with pytest.raises(ValueError, match=r"^stop holds 65 entries; at most 64 are allowed$"):
        SamplingParams(stop=[f"s{i}" for i in range(MAX_STOP + 1)])
    with pytest.raises(ValueError, match=r"stop_token_ids holds 300000 entries; at most 1024"):
        SamplingParams(stop_token_ids=list(range(300000)))
