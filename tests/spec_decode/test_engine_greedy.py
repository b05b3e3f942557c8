"""Speculative decoding through ``LLM``: greedy outputs token for token as without
it, for ngram and suffix and k in {1, 2, 4}, with prefix caching and chunked
prefill on and under forced preemption; stops, max_tokens and logprobs exact."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from fd_core.config import UnsupportedFeatureError

MAX_TOKENS = 20
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
BASE = dict(backend="cpu", max_model_len=512, max_num_seqs=8, num_gpu_blocks_override=128, block_size=16,
            enable_prefix_caching=True)


def _prompts(n: int = 8, seed: int = 0) -> list[list[int]]:
    """Repetitive prompts (a short pattern repeated), so the proposers find matches;
    two share a 40-token prefix, so prefix caching hits."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        pattern = [int(t) for t in rng.integers(100, 2048, int(rng.integers(3, 9)))]
        out.append((pattern * 20)[: int(rng.integers(20, 90))])
    out[1] = out[0][:40] + out[1]
    return out


def _llm(model, **kw) -> LLM:
    return LLM(str(model), **{**BASE, **kw})


def _run(model, prompts, params, **kw) -> tuple[list[list[int]], LLM]:
    llm = _llm(model, **kw)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.fixture(scope="module")
def dense(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


@pytest.fixture(scope="module")
def baseline(dense):
    prompts = _prompts()
    return prompts, _run(dense, prompts, GREEDY)[0]


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_greedy_equals_no_speculation_with_chunked_prefill_and_prefix_cache(dense, baseline, method, k):
    prompts, expected = baseline
    spec = {"method": method, "num_speculative_tokens": k}
    got, llm = _run(dense, prompts, GREEDY, speculative_config=spec, max_num_batched_tokens=37)
    assert got == expected
    stats = llm.engine.core.spec.stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0  # the path really ran
    kv = llm.engine.core.scheduler.kv_cache_manager
    assert kv.prefix_cache_stats.hits > 0
    assert kv.usage == 0.0  # every block back, rejected drafts' included


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_greedy_equals_no_speculation_under_preemption(dense, baseline, method):
    prompts, expected = baseline
    spec = {"method": method, "num_speculative_tokens": 4}
    got, llm = _run(dense, prompts, GREEDY, speculative_config=spec, num_gpu_blocks_override=14,
                    max_num_batched_tokens=64)
    assert got == expected
    assert llm.engine.core.scheduler.num_preemptions > 0


def test_stop_token_and_max_tokens_cut_inside_accepted_drafts(dense, baseline):
    prompts, expected = baseline
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    # stop at a token the baseline emits late in its output; max_tokens smaller than a step's tokens
    stops = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                            stop_token_ids=[out[12]]) for out in expected]
    want = [out[: out.index(out[12]) + 1] for out in expected]
    got, _ = _run(dense, prompts, stops, speculative_config=spec)
    assert got == want
    short = SamplingParams(max_tokens=7, temperature=0, ignore_eos=True)
    got, _ = _run(dense, prompts, short, speculative_config=spec)
    assert got == [out[:7] for out in expected]


def test_stop_string_cuts_the_text(dense):
    prompts = _prompts(4, seed=2)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    plain = _llm(dense).generate(prompts, params, use_tqdm=False)
    texts = [o.outputs[0].text for o in plain]
    stop = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                           stop=[t[len(t) // 2: len(t) // 2 + 3]]) if len(t) > 8 else params for t in texts]
    spec = {"method": "suffix", "num_speculative_tokens": 4}
    base = [o.outputs[0] for o in _llm(dense).generate(prompts, stop, use_tqdm=False)]
    got = [o.outputs[0] for o in _llm(dense, speculative_config=spec).generate(prompts, stop, use_tqdm=False)]
    assert [(o.text, o.token_ids, o.finish_reason) for o in got] == [(o.text, o.token_ids, o.finish_reason)
                                                                    for o in base]


def test_logprobs_of_accepted_tokens_equal_no_speculation(dense, baseline):
    prompts, expected = baseline
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=3)
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    base = _llm(dense).generate(prompts[:4], params, use_tqdm=False)
    llm = _llm(dense, speculative_config=spec)
    got = llm.generate(prompts[:4], params, use_tqdm=False)
    assert llm.engine.core.spec.stats.num_accepted_tokens > 0
    for b, g in zip(base, got):
        assert g.outputs[0].token_ids == b.outputs[0].token_ids
        assert len(g.outputs[0].logprobs) == len(b.outputs[0].logprobs) == MAX_TOKENS
        for pb, pg in zip(b.outputs[0].logprobs, g.outputs[0].logprobs):
            assert set(pb) == set(pg)
            for tok in pb:
                assert pg[tok].logprob == pytest.approx(pb[tok].logprob, abs=1e-4)
                assert pg[tok].rank == pb[tok].rank


def test_penalised_request_decodes_without_drafts(dense, baseline):
    prompts, _ = baseline
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, repetition_penalty=1.3)
    expected, _ = _run(dense, prompts[:3], params)
    got, llm = _run(dense, prompts[:3], params, speculative_config={"method": "ngram"})
    assert got == expected
    assert llm.engine.core.spec.stats.num_draft_tokens == 0


def test_seeded_sampling_with_speculation_is_reproducible(dense, baseline):
    prompts, _ = baseline
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.9, seed=7 + i, ignore_eos=True)
              for i in range(len(prompts))]
    spec = {"method": "suffix", "num_speculative_tokens": 3}
    first, llm = _run(dense, prompts, params, speculative_config=spec)
    second, _ = _run(dense, prompts, params, speculative_config=spec)
    assert first == second
    assert all(len(o) == MAX_TOKENS for o in first)
    assert llm.engine.core.spec.stats.num_draft_tokens > 0


def test_bad_configs_are_refused_by_name(dense):
    # mtp on a checkpoint without MTP weights: tests/spec_decode/test_mtp_engine.py
    with pytest.raises(UnsupportedFeatureError, match="'mtp'.*--tensor-parallel-size 2"):
        _llm(dense, speculative_config={"method": "mtp"}, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        _llm(dense, speculative_config={"method": "ngram", "prompt_lookup_max": 3})


def test_sampled_path_with_top_k_1_equals_no_speculation(dense, baseline):
    """top_k=1 makes the target one-hot: the rejection rule must then emit exactly the
    tokens decoding without speculation samples (checks the sampled path's row wiring)."""
    prompts, expected = baseline
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.7, top_k=1, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    got, llm = _run(dense, prompts, params, speculative_config={"method": "suffix", "num_speculative_tokens": 4})
    assert got == expected
    stats = llm.engine.core.spec.stats
    assert stats.num_accepted_tokens > 0 and stats.num_accepted_tokens < stats.num_draft_tokens


def test_final_output_carries_the_request_acceptance_figures(dense, baseline):
    prompts, _ = baseline
    llm = _llm(dense, speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    stats = llm.engine.core.spec.stats
    assert sum(o.metrics.num_draft_tokens for o in outs) == stats.num_draft_tokens > 0
    assert sum(o.metrics.num_accepted_tokens for o in outs) == stats.num_accepted_tokens > 0
    rates = [o.metrics.draft_acceptance_rate for o in outs if o.metrics.num_draft_tokens]
    assert rates and all(0.0 <= r <= 1.0 for r in rates)
