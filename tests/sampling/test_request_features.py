"""The sampler's FastDeploy request features: temperature-scaled and top-p
normalised logprobs against numpy, logits processors (loading, refusal,
effect), the thinking budget and the repetition early stop."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import paddle
import pytest

from fd_core import envs
from fd_core.sampling.early_stop import EarlyStopConfig
from fd_core.sampling.logits_processors import (
    LogitBiasLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorContext,
    check_request_args,
    load_logits_processors,
)
from fd_core.sampling.logprobs import EXCLUDED_LOGPROB
from fd_core.sampling.params import SamplingParams
from fd_core.sampling.reasoning_budget import (
    ReasoningBudget,
    ThinkingTokens,
    forced_sequence,
    prompt_ends_reasoning,
)
from fd_core.sampling.sampler import Sampler, SamplingState

V = 40
CONTEXT = LogitsProcessorContext(vocab_size=V, device_type="cpu")
THINK = ThinkingTokens(end_id=31, start_id=30, boundary_ids=frozenset({3}))


@pytest.fixture(scope="module")
def ops(cpu_backend):
    return cpu_backend.ops


def _tensor(x):
    return paddle.to_tensor(np.asarray(x, np.float32))


def _state(prompt=(1,), output=(), eos=(2,), thinking=None, **params):
    return SamplingState.create(SamplingParams(**params), list(prompt), eos_token_ids=eos,
                                output_token_ids=list(output), thinking=thinking)


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


class ForceToken(LogitsProcessor):
    """The tests' example processor: ``{"force_token": t}`` makes ``t`` all but certain."""

    arg_keys: ClassVar[tuple[str, ...]] = ("force_token",)

    def validate_args(self, args: Any) -> None:
        t = args["force_token"]
        if not isinstance(t, int) or not 0 <= t < self.context.vocab_size:
            raise ValueError(f"logits_processors_args.force_token must be a token id, got {t!r}")

    def apply(self, logits):  # in place, as a processor may
        for i, state in enumerate(self.rows):
            if state is not None:
                logits[i, state.params.logits_processors_args["force_token"]] += 50.0
        return logits


FORCE = f"{__name__}:ForceToken"


# ------------------------------------------------------------- logprobs options


def _top_p_normalized(logprobs, top_p):
    order = np.argsort(-logprobs, kind="stable")
    probs = np.exp(logprobs[order])
    keep_sorted = (np.cumsum(probs) - probs) <= top_p
    out = np.full_like(logprobs, EXCLUDED_LOGPROB)
    out[order[keep_sorted]] = logprobs[order[keep_sorted]] - np.log(probs[keep_sorted].sum())
    return out


def test_temp_scaled_and_top_p_normalized_logprobs_match_numpy(ops):
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 3, (4, V)).astype(np.float32)
    states = [
        _state(seed=1, logprobs=5, temperature=0.5, temp_scaled_logprobs=True),
        _state(seed=2, logprobs=5, temperature=0.7, top_p=0.6, top_p_normalized_logprobs=True),
        _state(seed=3, logprobs=20, temperature=2.0, top_p=0.5, temp_scaled_logprobs=True,
               top_p_normalized_logprobs=True),
        _state(temperature=0.0, logprobs=3, temp_scaled_logprobs=True),  # greedy: not scaled
    ]
    out = Sampler(ops, V, "sort").sample(_tensor(logits), states)
    refs = [
        _log_softmax(logits[0] / 0.5),
        _top_p_normalized(_log_softmax(logits[1]), 0.6),
        _top_p_normalized(_log_softmax(logits[2] / 2.0), 0.5),
        _log_softmax(logits[3]),
    ]
    for i, ref in enumerate(refs):
        entry, token = out.logprobs[i], out.sampled_token_ids[i]
        assert entry.logprob == pytest.approx(ref[token], abs=1e-4)
        k = states[i].params.logprobs
        order = np.argsort(-ref, kind="stable")[:k]
        np.testing.assert_allclose([v for _, v in entry.top], ref[order], rtol=1e-4, atol=1e-4)
        kept = ref[order] > EXCLUDED_LOGPROB  # excluded tokens tie: their order is arbitrary
        assert [t for t, _ in entry.top][: kept.sum()] == order[kept].tolist()
    # the top-p set's logprobs sum to 1 once renormalised; the rest are clipped
    kept = refs[2][refs[2] > EXCLUDED_LOGPROB]
    assert 0 < len(kept) < 20 and np.exp(kept).sum() == pytest.approx(1.0, abs=1e-4)
    assert [v for _, v in out.logprobs[2].top][len(kept):] == [EXCLUDED_LOGPROB] * (20 - len(kept))


def test_top_p_normalisation_is_off_at_top_p_one(ops):
    logits = np.random.default_rng(12).normal(0, 2, (1, V)).astype(np.float32)
    state = _state(seed=1, logprobs=2, top_p_normalized_logprobs=True)
    entry = Sampler(ops, V, "sort").sample(_tensor(logits), [state]).logprobs[0]
    assert entry.logprob == pytest.approx(_log_softmax(logits[0])[entry.token_id], abs=1e-5)


# ------------------------------------------------------------- logits processors


def test_loading_names_the_bad_spec():
    cases = {
        "no_such_module_xyz:Thing": "cannot import module 'no_such_module_xyz'",
        f"{__name__}:Missing": "has no attribute 'Missing'",
        f"{__name__}:_log_softmax": "is not a logits processor",
        "fd_core.sampling.logits_processors:LogitsProcessor": "arg_keys must name",
        "": "expected 'pkg.module:Class'",
    }
    for spec, message in cases.items():
        with pytest.raises(ValueError, match=message) as info:
            load_logits_processors([spec], CONTEXT)
        assert repr(spec) in str(info.value)
    with pytest.raises(ValueError, match="both read logits_processors_args key 'logit_bias'"):
        load_logits_processors(["LogitBiasLogitsProcessor"] * 2, CONTEXT)


def test_fastdeploy_spellings_load_the_builtin():
    for spec in ("LogitBiasLogitsProcessor",
                 "fastdeploy.model_executor.logits_processor:LogitBiasLogitsProcessor",
                 "fd_core.sampling.logits_processors.LogitBiasLogitsProcessor"):
        (p,) = load_logits_processors([spec], CONTEXT)
        assert isinstance(p, LogitBiasLogitsProcessor) and p.context == CONTEXT


def test_request_args_nobody_reads_are_refused():
    with pytest.raises(ValueError, match=r"'logit_bias' are read by no loaded.*--logits-processors"):
        check_request_args([], {"logit_bias": {"1": 1.0}})
    procs = load_logits_processors(["LogitBiasLogitsProcessor", FORCE], CONTEXT)
    check_request_args(procs, {"logit_bias": {"1": 1.0}, "force_token": 3})
    with pytest.raises(ValueError, match="'typo'"):
        check_request_args(procs, {"logit_bias": {}, "typo": 1})
    with pytest.raises(ValueError, match=r"logit_bias keys must be token ids in \[0, 40\), got '40'"):
        check_request_args(procs, {"logit_bias": {"40": 1.0}})
    with pytest.raises(ValueError, match="force_token must be a token id"):
        check_request_args(procs, {"force_token": -1})


def test_processors_change_only_the_rows_that_switch_them_on(ops):
    procs = load_logits_processors(["LogitBiasLogitsProcessor", FORCE], CONTEXT)
    sampler = Sampler(ops, V, "sort", logits_processors=procs)
    logits = np.random.default_rng(13).normal(0, 1, (3, V)).astype(np.float32)
    states = [
        _state(temperature=0.0, logits_processors_args={"logit_bias": {"17": 100.0}}),
        _state(temperature=0.0),
        _state(seed=5, logits_processors_args={"force_token": 23}),
    ]
    out = sampler.sample(_tensor(logits), states)
    assert out.sampled_token_ids == [17, int(logits[1].argmax()), 23]


def test_a_processor_changing_logits_in_place_leaves_logprobs_raw(ops):
    sampler = Sampler(ops, V, "sort", logits_processors=load_logits_processors([FORCE], CONTEXT))
    logits = np.random.default_rng(14).normal(0, 1, (1, V)).astype(np.float32)
    state = _state(seed=5, logprobs=0, logits_processors_args={"force_token": 23})
    out = sampler.sample(_tensor(logits), [state])
    assert out.sampled_token_ids == [23]
    assert out.logprobs[0].logprob == pytest.approx(_log_softmax(logits[0])[23], abs=1e-5)


# -------------------------------------------------------------- thinking budget


def test_where_the_output_starts_in_reasoning():
    assert prompt_ends_reasoning([5, 30, 7, 31, 8], THINK)  # the prompt closed its think block ...
    assert prompt_ends_reasoning([5, 31, 9, 3], THINK)  # ... trailing boundaries are passed over
    assert not prompt_ends_reasoning([5, 6, 7], THINK)  # nothing closed: the model thinks
    assert not prompt_ends_reasoning([30, 31, 3, 5], THINK)  # an earlier turn's block
    assert not prompt_ends_reasoning([31, 30, 6], THINK)  # reopened


@pytest.mark.parametrize("thinking, forced", [
    ("default", "end"),  # FastDeploy's default strategy: "</think>" alone
    ("x1", "x1"),  # FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR="\\n</think>\\n\\n": its whole sequence
])
def test_budget_forces_its_sequence_from_token_n_plus_1(ops, thinking, forced):
    n = 3
    tokens = THINK if thinking == "default" else X1
    expected = [THINK.end_id] if forced == "end" else [NL, 31, NL, NL]
    sampler = Sampler(ops, V, "sort")
    logits = np.zeros((1, V), np.float32)
    logits[0, 7] = 10.0  # greedy always picks 7
    state = _state(temperature=0.0, reasoning_max_tokens=n, max_tokens=12, thinking=tokens)
    for _ in range(n + len(expected) + 2):
        state.output_token_ids.append(sampler.sample(_tensor(logits), [state]).sampled_token_ids[0])
    assert state.output_token_ids == [7] * n + expected + [7, 7]


def test_budget_state_comes_from_the_output_alone():
    budget = ReasoningBudget(2, THINK.end_id)
    assert budget.next_token([7], 7, (2,)) == 7
    assert budget.next_token([7, 7], 7, (2,)) == THINK.end_id  # recomputed: same answer
    assert ReasoningBudget(2, THINK.end_id).next_token([7, 7], 9, (2,)) == THINK.end_id
    assert budget.next_token([7, 7, THINK.end_id], 9, (2,)) == 9  # reasoning over
    assert budget.next_token([7, 7, THINK.end_id, 5, 6], 9, (2,)) == 9
    assert budget.next_token([7], 9, (2,)) == 9  # a shorter output is scanned again
    assert budget.next_token([7, 7], 9, (2,)) == THINK.end_id


def test_eos_while_thinking_becomes_think_end():
    budget = ReasoningBudget(10, THINK.end_id)
    assert budget.next_token([7], 2, (2,)) == THINK.end_id
    assert budget.next_token([7, THINK.end_id], 2, (2,)) == 2


def test_no_budget_when_the_prompt_closed_reasoning_or_unset():
    assert _state(reasoning_max_tokens=2, max_tokens=5, prompt=[30, 31],
                  thinking=THINK).reasoning is None
    assert _state(thinking=THINK).reasoning is None
    assert _state(reasoning_max_tokens=2, max_tokens=5, thinking=THINK).reasoning is not None


def test_budget_without_think_end_token_is_refused():
    with pytest.raises(ValueError, match="reasoning_max_tokens needs a model whose tokenizer has"):
        _state(reasoning_max_tokens=2, max_tokens=5)


NL = 10  # the newline token of the "\n</think>\n\n" strategy below
X1 = ThinkingTokens(end_id=31, start_id=30, boundary_ids=frozenset({3}), forced_ids=(NL, 31, NL, NL))


def test_forcing_runs_to_its_end_whatever_is_sampled():
    budget = ReasoningBudget(2, 31, (NL, 31, NL, NL))
    out = [7, 7]
    for sampled in (9, 31, 2, 31, 2):  # </think> and EOS while forcing change nothing
        out.append(budget.next_token(out, sampled, (2,)))
    assert out == [7, 7, NL, 31, NL, NL, 2]  # after the sequence: the model's own tokens


def test_string_strategy_state_comes_from_the_output_alone():
    forced = (NL, 31, NL, NL)
    for k in range(len(forced)):  # a fresh budget (recomputed request) resumes mid-sequence
        assert ReasoningBudget(2, 31, forced).next_token([7, 7, *forced[:k]], 9, (2,)) == forced[k]
    assert ReasoningBudget(2, 31, forced).next_token([7, 7, *forced], 9, (2,)) == 9
    # the model closed the reasoning itself, before or at the budget: nothing forced
    assert ReasoningBudget(2, 31, forced).next_token([7, 31], 9, (2,)) == 9
    assert ReasoningBudget(2, 31, forced).next_token([7, 7], 31, (2,)) == 31
    assert ReasoningBudget(2, 31, forced).next_token([7, 7, 31], 9, (2,)) == 9
    # a natural newline before the budget forces nothing
    assert ReasoningBudget(5, 31, forced).next_token([7, NL], 9, (2,)) == 9


def test_eos_while_thinking_starts_the_string_sequence():
    budget = ReasoningBudget(10, 31, (NL, 31, NL, NL))
    out = [7]
    for _ in range(5):
        out.append(budget.next_token(out, 2, (2,)))
    assert out == [7, NL, 31, NL, NL, 2]
    assert budget.next_token([7], 9, (2,)) == 9  # rolled back before the EOS: forgotten
    assert budget.next_token([7, NL], 9, (2,)) == 9


class _Tokenizer:
    """What forced_sequence reads of fd_core.tokenizer.Tokenizer, over a toy vocabulary."""

    def __init__(self, pieces):
        self.pieces = pieces  # id -> text; id 0 is <unk>
        self.added_tokens = {p: i for i, p in enumerate(pieces) if p.startswith("<")}

    def convert_tokens_to_ids(self, piece):
        return self.pieces.index(piece) if piece in self.pieces else 0

    def convert_ids_to_tokens(self, i):
        return self.pieces[i]

    def encode(self, text):
        ids, rest = [], text
        while rest:
            piece = max((p for p in self.pieces[1:] if rest.startswith(p)), key=len, default=None)
            ids.append(0 if piece is None else self.pieces.index(piece))
            rest = rest[len(piece or rest[0]):]
        return ids

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_forced_sequence_uses_the_newline_token_for_each_newline():
    tok = _Tokenizer(["<unk>", "\n", "\n\n", "</think>", "ok"])
    assert forced_sequence("\n</think>\n\n", tok) == (1, 3, 1, 1)  # never the "\n\n" piece
    assert forced_sequence("</think>", tok) == (3,)
    assert forced_sequence("ok</think>", tok) == (4, 3)
    with pytest.raises(ValueError, match="decode to"):
        forced_sequence("zz</think>", tok)  # "z" is unknown to this vocabulary
    with pytest.raises(ValueError, match="no newline token"):
        forced_sequence("\n</think>", _Tokenizer(["<unk>", "</think>"]))
    with pytest.raises(ValueError, match="has no '</think>' token"):
        forced_sequence("</think>", _Tokenizer(["<unk>", "\n"]))


@pytest.mark.parametrize("raw,expected", [
    (None, "</think>"), ("", "</think>"), ("\n</think>\n\n", "\n</think>\n\n"),
    ("\\n</think>\\n\\n", "\n</think>\n\n"),  # a written \n is a newline
])
def test_truncate_str_values(monkeypatch, raw, expected):
    name = "FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR"
    if raw is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, raw)
    envs.reset()
    try:
        assert envs.get(name) == expected
    finally:
        envs.reset()


def test_a_truncate_str_without_think_end_is_refused(monkeypatch):
    monkeypatch.setenv("FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR", "\n\n")
    envs.reset()
    try:
        with pytest.raises(ValueError, match="FD_LIMIT_THINKING_CONTENT_TRUNCATE_STR.*'</think>'"):
            envs.check_values()
    finally:
        envs.reset()


# ------------------------------------------------------------------- early stop


def test_early_stop_config_validation():
    assert EarlyStopConfig.from_args(False, None) is None
    assert EarlyStopConfig.from_args(True, None) == EarlyStopConfig("repetition", 3000, 0.99)
    on = EarlyStopConfig.from_args(False, '{"enable_early_stop": true, "window_size": 5}')
    assert on == EarlyStopConfig(window_size=5)
    cases = [
        ({"window": 3}, r"unknown key\(s\) 'window'"),
        ({"window_size": 0}, "window_size must be an integer >= 1, got 0"),
        ({"threshold": 1.0}, r"threshold must be in \(0, 1\), got 1.0"),
        ({"strategy": "entropy"}, "strategy must be one of repetition, got 'entropy'"),
        ("{bad json", "must be a JSON object"),
    ]
    for config, message in cases:
        with pytest.raises(ValueError, match=message):
            EarlyStopConfig.from_args(True, config)


def test_early_stop_after_window_confident_steps(ops):
    sampler = Sampler(ops, V, "sort", early_stop=EarlyStopConfig(window_size=3, threshold=0.9))
    sure = np.zeros((2, V), np.float32)
    sure[:, 4] = 30.0  # p(4) ~ 1
    unsure = np.zeros((2, V), np.float32)  # uniform
    states = [_state(temperature=0.0), _state(seed=1)]
    hits = [sampler.sample(_tensor(x), states).early_stopped for x in (sure, sure, unsure, sure, sure)]
    assert hits == [[False, False]] * 5  # the uniform step broke the run
    assert sampler.sample(_tensor(sure), states).early_stopped == [True, True]


def test_temperature_counts_in_the_confidence(ops):
    sampler = Sampler(ops, V, "sort", early_stop=EarlyStopConfig(window_size=1, threshold=0.9))
    logits = np.zeros((1, V), np.float32)
    logits[0, 4] = 8.0  # p ~ 0.987 at temperature 1, ~0.39 at temperature 4
    assert sampler.sample(_tensor(logits), [_state(seed=1)]).early_stopped == [True]
    assert sampler.sample(_tensor(logits), [_state(seed=1, temperature=4.0)]).early_stopped == [False]


@pytest.mark.parametrize("value", [1e39, float("inf"), -2e9, "5", True])
def test_logit_bias_processor_refuses_values_that_would_overflow_or_are_not_numbers(value):
    processor = LogitBiasLogitsProcessor(CONTEXT)
    with pytest.raises(ValueError, match=r"logit_bias values must be numbers in \[-1e\+09, 1e\+09\]"):
        processor.validate_args({"logit_bias": {"5": value}})
    processor.validate_args({"logit_bias": {"5": -1e9}})  # a ban stays possible


def test_forced_sequence_on_a_byte_level_bpe_tokenizer(tmp_path):
    """Qwen3's tokenizer.json spells the newline as a byte piece, not "\\n" or "<0x0A>"."""
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.tokenizer import load_tokenizer

    tok = load_tokenizer(generate_checkpoint(tmp_path / "q", "tiny-qwen3"))
    ids = forced_sequence("\n</think>\n\n", tok)
    assert tok.decode(list(ids)) == "\n</think>\n\n"
    assert ids.count(tok.encode("\n")[0]) == 3
