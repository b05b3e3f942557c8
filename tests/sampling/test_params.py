"""SamplingParams: vLLM/FastDeploy defaults, normalisation, and validation
messages that name the field, the bad value and what was expected."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from fd_core.sampling.params import MAX_LOGPROBS, SamplingParams


def test_defaults_follow_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (1, 1.0, 1.0, 0, 0.0, None)
    assert (p.max_tokens, p.min_tokens, p.stop, p.stop_token_ids) == (16, 0, [], [])
    assert (p.ignore_eos, p.bad_words, p.bad_words_token_ids) == (False, [], None)
    assert (p.logprobs, p.prompt_logprobs, p.logit_bias) == (None, None, None)
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (p.include_stop_str_in_output, p.skip_special_tokens) == (False, True)
    assert not p.greedy and not p.has_penalties


def test_normalisation():
    p = SamplingParams(top_k=-1, stop="###", bad_words="darn", temperature=1, max_tokens=None,
                       stop_token_ids=(7, 8), logit_bias={"12": 3, 5: -1.5},
                       bad_words_token_ids=[(1, 2), [3]])
    assert p.top_k == 0 and p.stop == ["###"] and p.bad_words == ["darn"]
    assert isinstance(p.temperature, float) and p.max_tokens is None
    assert p.stop_token_ids == [7, 8]
    assert p.logit_bias == {12: 3.0, 5: -1.5}
    assert p.bad_words_token_ids == [[1, 2], [3]]


@pytest.mark.parametrize("temperature,greedy", [(0, True), (0.0, True), (1e-6, True),
                                                (1e-4, False), (0.7, False)])
def test_greedy_property(temperature, greedy):
    assert SamplingParams(temperature=temperature).greedy is greedy


@pytest.mark.parametrize("field,value", [("repetition_penalty", 1.1), ("presence_penalty", -0.5),
                                         ("frequency_penalty", 0.2)])
def test_has_penalties(field, value):
    assert SamplingParams(**{field: value}).has_penalties


def test_frozen_replace_validates_and_clone_is_deep():
    p = SamplingParams(stop=["a"], logit_bias={1: 1.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5  # type: ignore[misc]
    q = p.replace(temperature=0.0, top_k=-1)
    assert q.greedy and q.top_k == 0 and p.temperature == 1.0
    q.stop.append("b")
    assert p.stop == ["a"], "replace must not share lists with the original"
    with pytest.raises(ValueError, match="top_p"):
        p.replace(top_p=0)
    c = p.clone()
    assert c == p
    c.logit_bias[2] = 1.0  # type: ignore[index]
    assert p.logit_bias == {1: 1.0}


BAD = [
    ("n", 0, ">= 1"), ("n", 1.5, ">= 1"), ("n", True, ">= 1"),
    ("temperature", -1.0, ">= 0"), ("temperature", float("nan"), ">= 0"),
    ("temperature", float("inf"), "finite"), ("temperature", "hot", ">= 0"),
    ("temperature", 1e39, "float32's largest"),
    ("top_p", 0, "(0, 1]"), ("top_p", 1.5, "(0, 1]"), ("top_p", -0.1, "(0, 1]"),
    ("top_k", -5, "-1, 0 or a positive integer"), ("top_k", 2.5, "-1, 0 or a positive integer"),
    ("min_p", -0.1, "[0, 1]"), ("min_p", 1.01, "[0, 1]"),
    ("seed", 1.5, "integer"), ("seed", "42", "integer"),
    ("max_tokens", 0, ">= 1"), ("max_tokens", -3, ">= 1"),
    ("min_tokens", -1, ">= 0"),
    ("stop", 5, "string"), ("stop", ["ok", ""], "non-empty"), ("stop", [3], "non-empty"),
    ("stop_token_ids", [1, -2], ">= 0"), ("stop_token_ids", "12", "list"),
    ("bad_words", [None], "non-empty"),
    ("bad_words_token_ids", [[]], "non-empty"), ("bad_words_token_ids", [[1, -1]], ">= 0"),
    ("bad_words_token_ids", [5, -1], ">= 0"), ("bad_words_token_ids", ["7"], "token ids"),
    ("bad_words_token_ids", 5, "list"),
    ("reasoning_max_tokens", 0, ">= 1"), ("reasoning_max_tokens", 2.5, ">= 1"),
    ("reasoning_max_tokens", True, ">= 1"), ("reasoning_max_tokens", 17, "<= max_tokens"),
    ("logits_processors_args", ["logit_bias"], "dict"), ("logits_processors_args", {1: 2}, "strings"),
    ("logits_processors_args", {"": 2}, "strings"),
    ("temp_scaled_logprobs", 1, "bool"), ("top_p_normalized_logprobs", "yes", "bool"),
    ("ignore_eos", 1, "bool"), ("skip_special_tokens", "yes", "bool"),
    ("include_stop_str_in_output", None, "bool"),
    ("logprobs", -1, f"[0, {MAX_LOGPROBS}]"), ("logprobs", MAX_LOGPROBS + 1, f"[0, {MAX_LOGPROBS}]"),
    ("prompt_logprobs", 100, f"[0, {MAX_LOGPROBS}]"),
    ("repetition_penalty", 0.0, "> 0"), ("repetition_penalty", -1, "> 0"),
    ("presence_penalty", 2.5, "[-2, 2]"), ("frequency_penalty", -3, "[-2, 2]"),
    ("logit_bias", [1, 2], "dict"), ("logit_bias", {"x": 1.0}, "token ids"),
    ("logit_bias", {-1: 1.0}, "token ids"), ("logit_bias", {5: 101.0}, "[-100, 100]"),
    ("logit_bias", {5: float("nan")}, "[-100, 100]"),
]


@pytest.mark.parametrize("field,value,expected", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_bad_values_are_named_in_the_error(field, value, expected):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert field.split("_ids")[0] in message, message
    shown = repr(value) if not isinstance(value, dict) else repr(next(iter(value.items()))[0])
    assert shown in message or repr(value) in message, message
    assert expected in message, message


def test_exact_messages():
    cases = [
        (dict(temperature=-1.0), "temperature must be a finite number >= 0 and <= 3.403e+38 (float32's largest), "
                                 "got -1.0"),
        (dict(top_p=0), "top_p must be in (0, 1], got 0"),
        (dict(top_k=-5), "top_k must be -1, 0 or a positive integer, got -5"),
        (dict(min_tokens=5, max_tokens=3),
         "min_tokens must be <= max_tokens, got min_tokens=5 and max_tokens=3"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError) as info:
            SamplingParams(**kwargs)
        assert str(info.value) == message


def test_min_tokens_without_max_tokens_is_fine():
    assert SamplingParams(min_tokens=100, max_tokens=None).min_tokens == 100


def test_importing_params_pulls_in_neither_paddle_nor_numpy():
    code = ("import sys, fd_core.sampling, fd_core.sampling.params; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('paddle', 'numpy')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_n_has_an_upper_bound():
    from fd_core.sampling.params import MAX_N

    assert SamplingParams(n=MAX_N).n == MAX_N
    with pytest.raises(ValueError, match=rf"n must be <= {MAX_N} \(samples per request\), got 1000000"):
        SamplingParams(n=1_000_000)
