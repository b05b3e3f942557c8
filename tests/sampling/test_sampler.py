"""Sampler: greedy rows, per-request seeded draws independent of the batch,
logits processors against a plain numpy implementation, and logprobs."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core import envs
from fd_core.sampling import logprobs as logprobs_mod
from fd_core.sampling.logprobs import compute_prompt_logprobs
from fd_core.sampling.params import SamplingParams
from fd_core.sampling.sampler import NUM_UNIFORMS, Sampler, SamplingState

V = 40
METHODS = ["sort", "rejection"]


@pytest.fixture(scope="module")
def ops(cpu_backend):
    return cpu_backend.ops


class RecordingOps:
    """Delegates ``sample`` and keeps the logits it was given (after processing)."""

    def __init__(self, ops):
        self.ops, self.logits = ops, None

    def sample(self, logits, *args):
        self.logits = logits.numpy()
        return self.ops.sample(logits, *args)


def _tensor(x):
    return paddle.to_tensor(np.asarray(x, np.float32))


def _state(prompt=(), output=(), eos=(2,), words=(), **params):
    return SamplingState.create(SamplingParams(**params), list(prompt), eos_token_ids=eos,
                                bad_words_token_ids=words, output_token_ids=list(output))


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _processed(ops, logits, states):
    """The logits the sample op receives (all rows sampled, not greedy)."""
    rec = RecordingOps(ops)
    Sampler(rec, logits.shape[1], "sort").sample(_tensor(logits), states)
    return rec.logits


# ------------------------------------------------------------------ greedy


def test_greedy_rows_take_the_argmax(ops):
    logits = np.random.default_rng(0).normal(size=(5, V)).astype(np.float32)
    states = [_state(temperature=0.0, top_k=3, top_p=0.5) for _ in range(4)]
    states.append(_state(temperature=1e-6))  # below GREEDY_EPS
    out = Sampler(ops, V, "sort").sample(_tensor(logits), states)
    assert out.sampled_token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 5


@pytest.mark.parametrize("method", METHODS)
def test_mixed_batch_greedy_rows_are_argmax_and_draw_nothing(ops, method):
    logits = np.random.default_rng(1).normal(size=(4, V)).astype(np.float32)
    states = [_state(temperature=0.0, seed=1), _state(seed=2), _state(temperature=0.0), _state()]
    before = states[0].generator.bit_generator.state
    out = Sampler(ops, V, method).sample(_tensor(logits), states)
    assert out.sampled_token_ids[0] == logits[0].argmax()
    assert out.sampled_token_ids[2] == logits[2].argmax()
    assert states[0].generator.bit_generator.state == before


def test_each_sampled_token_consumes_exactly_one_draw(ops):
    state = _state(seed=123, top_k=5)
    logits = np.random.default_rng(2).normal(size=(1, V)).astype(np.float32)
    for method in METHODS:
        Sampler(ops, V, method).sample(_tensor(logits), [state])
    twin = np.random.default_rng(123)
    twin.random(NUM_UNIFORMS, dtype=np.float32)
    twin.random(NUM_UNIFORMS, dtype=np.float32)
    assert state.generator.random() == twin.random()


# ------------------------------------------------------------------- seeds


def _generate(ops, method, target_params, neighbours, position, steps=8, seed_logits=3):
    """Sample ``steps`` tokens for one request placed at ``position`` among
    ``neighbours`` (fresh states each step's batch); returns its tokens."""
    rng = np.random.default_rng(seed_logits)
    target = SamplingState.create(target_params, [1, 2, 3])
    sampler = Sampler(ops, V, method)
    for _ in range(steps):
        batch = list(neighbours)
        batch.insert(position, target)
        logits = rng.normal(0, 2, (len(batch), V)).astype(np.float32)
        logits[position] = np.sin(np.arange(V) * (1 + len(target.output_token_ids)))  # fixed per step
        out = sampler.sample(_tensor(logits), batch)
        target.output_token_ids.append(out.sampled_token_ids[position])
        for i, s in enumerate(batch):
            if i != position:
                s.output_token_ids.append(out.sampled_token_ids[i])
    return target.output_token_ids


@pytest.mark.parametrize("method", METHODS)
def test_same_seed_same_tokens_regardless_of_batch(ops, method):
    params = SamplingParams(seed=42, temperature=0.9, top_p=0.95, top_k=30)
    alone = _generate(ops, method, params, [], 0)
    neighbours = [_state(seed=7, top_k=3), _state(), _state(temperature=0.0),
                  _state(seed=9, min_p=0.2, repetition_penalty=1.3, logprobs=2)]
    assert _generate(ops, method, params, neighbours, 2) == alone
    others = [_state(top_p=0.3), _state(seed=42)]  # even a neighbour with the same seed
    assert _generate(ops, method, params, others, 0) == alone
    assert _generate(ops, method, params, others, 2) == alone


@pytest.mark.parametrize("method", METHODS)
def test_different_or_missing_seeds_differ(ops, method):
    runs = [_generate(ops, method, SamplingParams(seed=s), [], 0, steps=12) for s in (1, 2)]
    assert runs[0] != runs[1]
    unseeded = [_generate(ops, method, SamplingParams(), [], 0, steps=12) for _ in range(2)]
    assert unseeded[0] != unseeded[1]


def test_negative_and_huge_seeds_are_accepted(ops):
    a = _generate(ops, "sort", SamplingParams(seed=-1), [], 0, steps=4)
    b = _generate(ops, "sort", SamplingParams(seed=2**64 - 1), [], 0, steps=4)
    assert a == b  # seeds are taken mod 2**64


# ------------------------------------------------------------- processors


def _numpy_processed(logits, prompt, output, p: SamplingParams, eos, words):
    """A straightforward per-request, per-token implementation (vLLM semantics)."""
    x = np.array(logits, np.float64)
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    for w in words:
        if len(w) == 1 or (len(output) >= len(w) - 1 and list(output[len(output) - len(w) + 1:]) == w[:-1]):
            x[w[-1]] = -np.inf
    if len(output) < p.min_tokens:
        for t in list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos)):
            x[t] = -np.inf
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.presence_penalty + p.frequency_penalty * output.count(t)
    return x


def test_penalties_and_bias_match_numpy(ops):
    rng = np.random.default_rng(4)
    cases = [
        dict(repetition_penalty=1.5),
        dict(repetition_penalty=0.7),
        dict(presence_penalty=1.2),
        dict(frequency_penalty=0.6),
        dict(presence_penalty=-0.4, frequency_penalty=-0.3),
        dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25,
             logit_bias={0: 5.0, 7: -3.0, 11: 0.5}),
        dict(logit_bias={3: 100.0}),
        dict(),
    ]
    states, logits = [], rng.normal(0, 3, (len(cases), V)).astype(np.float32)
    for kwargs in cases:
        prompt = rng.integers(0, V, 12).tolist()
        output = rng.integers(0, V, 9).tolist() + [5, 5, 5]
        states.append(_state(prompt, output, **kwargs))
    got = _processed(ops, logits, states)
    for i, s in enumerate(states):
        want = _numpy_processed(logits[i], s.prompt_token_ids, s.output_token_ids, s.params, (2,), [])
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5, err_msg=str(cases[i]))


def test_bad_words_single_and_multi_token(ops):
    words = [[9], [4, 6], [1, 2, 3]]
    outputs = [[], [7, 4], [1, 2], [5, 1, 2], [4, 6], [2, 3]]
    states = [_state(output=o, words=words) for o in outputs]
    states.append(_state(output=[4], bad_words_token_ids=[[4, 8]], words=[[12]]))  # both sources
    logits = np.random.default_rng(5).normal(size=(len(states), V)).astype(np.float32)
    got = _processed(ops, logits, states)
    banned = [set(np.flatnonzero(np.isneginf(row)).tolist()) for row in got]
    assert banned == [{9}, {9, 6}, {9, 3}, {9, 3}, {9}, {9}, {8, 12}]
    for i, s in enumerate(states):
        want = _numpy_processed(logits[i], [], s.output_token_ids, s.params, (2,), s.bad_words_token_ids)
        np.testing.assert_allclose(got[i], want, rtol=1e-6)


def test_banned_token_is_never_picked_even_when_it_is_the_argmax(ops):
    logits = np.zeros((2, V), np.float32)
    logits[:, 9] = 50.0
    states = [_state(words=[[9]], temperature=0.0), _state(words=[[9]], seed=0)]
    out = Sampler(ops, V, "sort").sample(_tensor(logits), states)
    assert 9 not in out.sampled_token_ids


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_blocks_eos_and_stop_ids_until_reached(ops, ignore_eos):
    logits = np.zeros((1, V), np.float32)
    logits[0, [2, 30, 31]] = 20.0  # eos 2 and stop ids 30, 31 dominate
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[30, 31],
                            ignore_eos=ignore_eos)
    state = SamplingState.create(params, [1], eos_token_ids=[2])
    sampler = Sampler(ops, V, "sort")
    for step in range(5):
        token = sampler.sample(_tensor(logits), [state]).sampled_token_ids[0]
        if step < 3:
            assert token not in (30, 31)
            assert (token == 2) == ignore_eos
        else:
            assert token in (2, 30, 31)
        state.output_token_ids.append(token)


def test_out_of_vocabulary_ids_are_refused_when_the_request_is_created():
    for kwargs in (dict(logit_bias={V: 1.0}), dict(stop_token_ids=[V + 3]),
                   dict(bad_words_token_ids=[[1, V]])):
        with pytest.raises(ValueError, match=f"outside the vocabulary \\[0, {V}\\)"):
            SamplingState.create(SamplingParams(**kwargs), [1], vocab_size=V)


def test_out_of_vocabulary_ids_fail_loudly_in_the_sampler(ops):
    state = _state(logit_bias={V + 1: 1.0})
    with pytest.raises(ValueError, match=f"token id {V + 1}"):
        Sampler(ops, V, "sort").sample(_tensor(np.zeros((1, V))), [state])


def test_vocabulary_padding_is_never_sampled(ops):
    logits = np.zeros((3, V + 8), np.float32)
    logits[:, V:] = 100.0
    states = [_state(temperature=0.0), _state(seed=1), _state(seed=2, logprobs=3)]
    out = Sampler(ops, V, "rejection").sample(_tensor(logits), states)
    assert all(t < V for t in out.sampled_token_ids)
    assert all(t < V for t, _ in out.logprobs[2].top)
    assert out.logprobs[2].logprob == pytest.approx(-np.log(V), rel=1e-5)


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_raw_log_softmax_with_topk_and_rank(ops):
    rng = np.random.default_rng(6)
    logits = rng.normal(0, 2, (5, V)).astype(np.float32)
    states = [
        _state(seed=1, logprobs=5, temperature=0.5, repetition_penalty=2.0, output=[3, 4]),
        _state(seed=2),  # does not ask
        _state(temperature=0.0, logprobs=0, logit_bias={int(logits[2].argmin()): 100.0}),
        _state(seed=3, logprobs=20, top_k=2),
        _state(seed=4, logprobs=1, min_tokens=5, output=[1]),
    ]
    out = Sampler(ops, V, "sort").sample(_tensor(logits), states)
    assert out.logprobs[1] is None
    ref = _log_softmax(logits)
    for i in (0, 2, 3, 4):
        entry, token = out.logprobs[i], out.sampled_token_ids[i]
        assert entry.token_id == token
        assert entry.logprob == pytest.approx(ref[i, token], abs=1e-5)
        assert entry.rank == int((ref[i] >= ref[i, token]).sum())
        k = states[i].params.logprobs
        order = np.argsort(-ref[i], kind="stable")[:k]
        assert [t for t, _ in entry.top] == order.tolist()
        np.testing.assert_allclose([v for _, v in entry.top], ref[i, order], atol=1e-5)
    assert out.sampled_token_ids[2] == logits[2].argmin()  # the bias steered greedy ...
    assert out.logprobs[2].rank == V and out.logprobs[2].top == []  # ... not the logprobs


def test_prompt_logprobs_match_numpy(ops, monkeypatch):
    monkeypatch.setattr(logprobs_mod, "PROMPT_CHUNK_ROWS", 3)  # several chunks
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, V, 8).tolist()
    logits = rng.normal(0, 2, (8, V)).astype(np.float32)
    ref = _log_softmax(logits)
    for tokens in (prompt, prompt + [5]):
        entries = compute_prompt_logprobs(_tensor(logits), tokens, 3)
        assert len(entries) == len(tokens) - 1
        for i, e in enumerate(entries):
            assert e.token_id == tokens[i + 1]
            assert e.logprob == pytest.approx(ref[i, tokens[i + 1]], abs=1e-5)
            assert e.rank == int((ref[i] >= ref[i, tokens[i + 1]]).sum())
            assert [t for t, _ in e.top] == np.argsort(-ref[i], kind="stable")[:3].tolist()
    assert all(e.top == [] for e in compute_prompt_logprobs(_tensor(logits), prompt, 0))
    with pytest.raises(ValueError, match="8 or 9 tokens, got 5"):
        compute_prompt_logprobs(_tensor(logits), prompt[:5], 1)


def test_logprobs_avoid_paddles_cpu_log_softmax(ops, monkeypatch):
    """paddle 3.3's CPU log_softmax takes ~9 s per [1, 103424] row; logprobs
    are x - logsumexp(x) instead, and stay right for large logits."""
    import paddle

    def refuse(*args, **kwargs):
        raise AssertionError("paddle.nn.functional.log_softmax called")

    monkeypatch.setattr(paddle.nn.functional, "log_softmax", refuse)
    logits = np.random.default_rng(8).normal(0, 3, (2, V)).astype(np.float32)
    logits[0, 7] = 90.0  # one dominant logit: the naive log(sum(exp)) overflows
    out = Sampler(ops, V, "sort").sample(_tensor(logits), [_state(temperature=0.0, logprobs=1)] * 2)
    ref = _log_softmax(logits)
    for i, entry in enumerate(out.logprobs):
        assert entry.logprob == pytest.approx(ref[i, entry.token_id], abs=1e-5)
    assert out.sampled_token_ids[0] == 7


# ------------------------------------------------------------ construction


def test_method_comes_from_fd_sampling_class(ops, monkeypatch):
    try:
        monkeypatch.setenv("FD_SAMPLING_CLASS", "rejection")
        envs.reset()
        assert Sampler(ops, V).method == "rejection"
        monkeypatch.setenv("FD_SAMPLING_CLASS", "base")
        envs.reset()
        assert Sampler(ops, V).method == "sort"
    finally:
        monkeypatch.delenv("FD_SAMPLING_CLASS")
        envs.reset()
    with pytest.raises(ValueError, match="got 'topk'"):
        Sampler(ops, V, "topk")


def test_shape_mismatches_are_reported(ops):
    sampler = Sampler(ops, V, "sort")
    with pytest.raises(ValueError, match="2 rows but 1 requests"):
        sampler.sample(_tensor(np.zeros((2, V))), [_state()])
    with pytest.raises(ValueError, match="fewer than vocab_size"):
        sampler.sample(_tensor(np.zeros((1, V - 1))), [_state()])
    assert sampler.sample(_tensor(np.zeros((0, V))), []).sampled_token_ids == []
