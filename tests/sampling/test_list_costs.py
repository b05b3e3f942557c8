"""A request's lists (bad words, stop ids, logit_bias) are compiled once, and the
per-step processors give exactly what a straightforward per-step pass over
the lists gives (the reference below, vLLM v1's semantics)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.sampling import penalties
from fd_core.sampling.bad_words import BadWordsMatcher
from fd_core.sampling.params import MAX_BAD_WORDS_TOKENS, SamplingParams
from fd_core.sampling.penalties import apply_bias_and_bans, apply_penalties, request_bans
from fd_core.sampling.sampler import SamplingState

V = 24
ALPHABET = 4  # bad words and outputs drawn from few tokens, so words match often


def _reference_banned(words, output, params, eos):
    banned = set()
    for word in words:
        prefix = len(word) - 1
        if prefix <= len(output) and (prefix == 0 or list(output[len(output) - prefix:]) == word[:-1]):
            banned.add(word[-1])
    if len(output) < params.min_tokens:
        banned.update(params.stop_token_ids)
        if not params.ignore_eos:
            banned.update(eos)
    return banned


def _reference(logits, states):
    """Bias, bans and penalties, each a dense fp32 pass per row over the lists."""
    out = np.array(logits, np.float32)
    for row, state in zip(out, states):
        p = state.params
        for token, bias in (p.logit_bias or {}).items():
            row[token] += np.float32(bias)
        for token in _reference_banned(state.bad_words_token_ids, state.output_token_ids, p,
                                       state.eos_token_ids):
            row[token] = -np.inf
    for row, state in zip(out, states):
        p = state.params
        if not p.has_penalties:
            continue
        counts = np.bincount(np.asarray(state.output_token_ids, np.int64), minlength=V).astype(np.float32)
        if p.repetition_penalty != 1.0:
            seen = counts > 0
            seen[list(state.prompt_token_ids)] = True
            factor = np.where(seen, np.float32(p.repetition_penalty), np.float32(1.0))
            row[:] = np.where(row > 0, row / factor, row * factor)
        row[:] = (row - np.float32(p.frequency_penalty) * counts
                  - np.float32(p.presence_penalty) * (counts > 0).astype(np.float32))
    return out


def _random_state(rng, words_from_engine=True):
    words = [rng.integers(0, ALPHABET, int(rng.integers(1, 5))).tolist() for _ in range(int(rng.integers(0, 6)))]
    params = SamplingParams(
        max_tokens=None,
        min_tokens=int(rng.integers(0, 4)),
        stop_token_ids=rng.integers(0, V, int(rng.integers(0, 3))).tolist(),
        ignore_eos=bool(rng.integers(0, 2)),
        logit_bias={int(t): float(rng.normal()) for t in rng.integers(0, V, int(rng.integers(0, 6)))} or None,
        bad_words_token_ids=None if words_from_engine else words,
        repetition_penalty=float(rng.choice([1.0, 1.3, 0.7])),
        presence_penalty=float(rng.choice([0.0, 0.5, -1.0])),
        frequency_penalty=float(rng.choice([0.0, 0.25])),
    )
    return SamplingState.create(params, rng.integers(0, V, int(rng.integers(1, 6))).tolist(),
                                eos_token_ids=(int(rng.integers(0, V)),),
                                bad_words_token_ids=words if words_from_engine else ())


@pytest.mark.parametrize("dense_bias_min", [4096, 0])
def test_processors_equal_the_per_step_reference_on_random_batches(monkeypatch, dense_bias_min):
    monkeypatch.setattr(penalties, "DENSE_BIAS_MIN", dense_bias_min)  # 0: every bias is a dense row
    rng = np.random.default_rng(dense_bias_min)
    for trial in range(12):
        states = [_random_state(rng, words_from_engine=bool(trial % 2)) for _ in range(int(rng.integers(1, 6)))]
        for _ in range(10):  # steps: the outputs grow by one token each (mostly from the alphabet)
            logits = rng.normal(size=(len(states), V)).astype(np.float32)
            got = apply_penalties(apply_bias_and_bans(paddle.to_tensor(logits), states), states)
            np.testing.assert_array_equal(got.numpy(), _reference(logits, states))
            for s in states:
                s.output_token_ids.append(int(rng.integers(0, ALPHABET + 2)))


def test_matcher_bans_exactly_the_words_whose_prefix_ends_the_output():
    rng = np.random.default_rng(1)
    for _ in range(40):
        words = [rng.integers(0, 3, int(rng.integers(1, 6))).tolist() for _ in range(int(rng.integers(1, 12)))]
        matcher = BadWordsMatcher(words)
        output: list[int] = []
        for _ in range(30):
            want = {w[-1] for w in words if len(w) - 1 <= len(output)
                    and (len(w) == 1 or output[len(output) - len(w) + 1:] == w[:-1])}
            assert set(matcher.banned(output).tolist()) == want, (words, output)
            output.append(int(rng.integers(0, 3)))


def test_matcher_rereads_an_output_that_was_cut_or_rewritten():
    matcher = BadWordsMatcher([[1, 2, 9], [5, 8]])
    assert matcher.banned([0, 1, 2]).tolist() == [9]
    assert matcher.banned([0, 1]).tolist() == []  # cut: [1, 2] no longer ends it
    assert matcher.banned([0, 5]).tolist() == [8]  # last token rewritten
    assert matcher.banned([0, 5, 1, 2]).tolist() == [9]


def test_matcher_trie_holds_each_distinct_prefix_once():
    matcher = BadWordsMatcher([[1, 2, 3, 9], [1, 2, 3, 8], [1, 2, 7], [4], [4]])
    assert matcher.num_nodes == 4  # root, [1], [1, 2], [1, 2, 3]
    assert matcher.banned([]).tolist() == [4]
    assert sorted(matcher.banned([1, 2, 3]).tolist()) == [4, 8, 9]
    assert sorted(matcher.banned([0, 1, 2]).tolist()) == [4, 7]


class _CountingList(list):
    """A list that counts how often it is iterated."""

    iterations = 0

    def __iter__(self):
        type(self).iterations += 1
        return super().__iter__()


def test_steps_do_not_walk_the_word_or_stop_lists(monkeypatch):
    words = [[7, t] for t in range(1000)] + [[t] for t in range(1000, 1024)]
    params = SamplingParams(min_tokens=100, stop_token_ids=list(range(2000, 3024)), max_tokens=200)
    state = SamplingState.create(params, [1], eos_token_ids=(3,))
    state.bad_words_token_ids = _CountingList(_CountingList(w) for w in words)
    object.__setattr__(params, "stop_token_ids", _CountingList(params.stop_token_ids))
    logits = paddle.zeros([1, 4096])
    for step in range(20):
        state.output_token_ids.append(7 if step % 2 else 5)
        out = apply_bias_and_bans(logits, [state]).numpy()[0]
        assert np.isneginf(out[2000:3024]).all() and np.isneginf(out[1000:1024]).all()
        assert np.isneginf(out[:1000]).all() == (step % 2 == 1)  # after a 7 every [7, t] bans t
        if step == 0:
            read_when_built = _CountingList.iterations
    # the lists were read when the request's bans were built, not at each step
    assert read_when_built > 0 and _CountingList.iterations == read_when_built
    bans = request_bans(state)
    assert bans.words.num_nodes == 2 and len(bans.min_tokens_ids) == 1025


def test_a_large_logit_bias_is_one_dense_row_built_once():
    bias = {t: 1.0 for t in range(0, 6000)}
    state = SamplingState.create(SamplingParams(logit_bias=bias), [1])
    bans = request_bans(state)
    assert bans.dense_bias
    logits = paddle.zeros([2, 8000])
    out = apply_bias_and_bans(logits, [SamplingState.create(SamplingParams(), [1]), state]).numpy()
    assert (out[0] == 0).all() and (out[1][:6000] == 1).all() and (out[1][6000:] == 0).all()
    row = bans.bias_row(8000, logits.place)
    apply_bias_and_bans(logits, [state])
    assert bans.bias_row(8000, logits.place) is row


def test_a_dense_logit_bias_outside_the_vocabulary_fails_loudly():
    state = SamplingState.create(SamplingParams(logit_bias={t: 1.0 for t in range(5000)}), [1])
    with pytest.raises(ValueError, match="logit_bias: token id 4000 .* outside the vocabulary"):
        apply_bias_and_bans(paddle.zeros([1, 4000]), [state])


def test_rows_without_penalties_are_left_bit_for_bit():
    logits = np.array([[-0.0, 1.5, -2.0, np.inf], [3.0, -0.0, 0.5, -np.inf]], np.float32)
    states = [SamplingState.create(SamplingParams(), [1, 2], output_token_ids=[0, 1]),
              SamplingState.create(SamplingParams(presence_penalty=1.0, repetition_penalty=2.0), [2],
                                   output_token_ids=[0])]
    got = apply_penalties(paddle.to_tensor(logits), states).numpy()
    assert got[0].tobytes() == logits[0].tobytes()
    np.testing.assert_array_equal(got[1], [0.5, -0.0, 0.25, -np.inf])


def test_bad_words_token_ids_are_bounded_in_total_tokens():
    SamplingParams(bad_words_token_ids=[[1] * 8] * (MAX_BAD_WORDS_TOKENS // 8))
    with pytest.raises(ValueError, match=rf"bad_words_token_ids hold {MAX_BAD_WORDS_TOKENS + 1} token ids "
                                         rf"in all; at most {MAX_BAD_WORDS_TOKENS} are allowed"):
        SamplingParams(bad_words_token_ids=[[1] * (MAX_BAD_WORDS_TOKENS + 1)])


def test_precomputed_bans_live_on_their_request_and_are_rebuilt_when_it_changes():
    import weakref

    state = SamplingState.create(SamplingParams(bad_words_token_ids=[[1, 2]], logit_bias={3: 1.0}), [1])
    apply_bias_and_bans(paddle.zeros([1, 8]), [state])
    bans = state.bans
    assert bans is not None and penalties.request_bans(state) is bans  # built once, reused
    state.params = state.params.replace(logit_bias={4: 1.0})
    assert penalties.request_bans(state) is not bans  # new parameters: compiled again
    ref = weakref.ref(state)
    del state, bans
    assert ref() is None  # freed by reference counting: the compiled bans point back at no state
