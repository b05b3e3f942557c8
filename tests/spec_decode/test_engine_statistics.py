"""Sampled output with speculation, through the whole engine, has the target's
distribution, and this test notices when the acceptance rule is broken.

``tests/spec_decode/test_verify_statistics.py`` checks the rule against exact
probabilities of a Markov chain; this one runs the real engine (``LLM`` on the
tiny ERNIE checkpoint, n-gram drafts, top-k 4 so each position has a small
support) and compares the first three sampled tokens of many seeded requests
with speculation against as many without it, by a two-sample chi-square over
the joint outcomes. The prompt repeats a pattern followed by the greedy
continuation, so the n-gram proposer drafts that continuation: drafts are
accepted often and rejected often, and both paths decide the sample.

Every request is seeded (different seeds on the two sides), so the test is
deterministic; p > 1e-3 only says the seeds were not picked to hide a bias.
With an acceptance rule that accepts every draft, the same
comparison must fail (p < 1e-6).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from fd_core.spec_decode import verify as verify_module
from tests.sampling.test_statistics import chi2_sf

SAMPLES, TOKENS = 1200, 3
ENGINE = dict(backend="cpu", max_model_len=256, max_num_seqs=64, num_gpu_blocks_override=256, block_size=16,
              enable_prefix_caching=True)
SPEC = {"method": "ngram", "num_speculative_tokens": 2}


def _two_sample_p(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> float:
    """Chi-square test that two samples come from one distribution; outcomes seen
    fewer than 10 times in both together are pooled into one cell."""
    ca, cb = Counter(a), Counter(b)
    common = [k for k in set(ca) | set(cb) if ca[k] + cb[k] >= 10]
    rest = (len(a) - sum(ca[k] for k in common), len(b) - sum(cb[k] for k in common))
    table = np.array([[ca[k], cb[k]] for k in common] + ([list(rest)] if sum(rest) else []), np.float64)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    return chi2_sf(stat, table.shape[0] - 1)


def _samples(llm: LLM, prompt: list[int], first_seed: int) -> list[tuple[int, ...]]:
    params = [SamplingParams(max_tokens=TOKENS, temperature=1.0, top_k=4, seed=first_seed + i, ignore_eos=True)
              for i in range(SAMPLES)]
    outs = llm.generate([prompt] * SAMPLES, params, use_tqdm=False)
    return [tuple(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def setup(checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    plain = LLM(str(model), **ENGINE)
    pattern = [int(t) for t in np.random.default_rng(5).integers(100, 2048, 6)]
    greedy = plain.generate([pattern * 3], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids
    # the prompt ends where it ended before the continuation, after a copy of both: the
    # n-gram proposer drafts the greedy continuation
    prompt = pattern * 3 + list(greedy) + pattern * 3
    return model, prompt, _samples(plain, prompt, 100_000)


def test_sampled_output_with_speculation_has_the_targets_distribution(setup):
    model, prompt, without = setup
    llm = LLM(str(model), speculative_config=SPEC, **ENGINE)
    with_spec = _samples(llm, prompt, 0)
    stats = llm.engine.core.spec.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # both paths of the rule decided samples
    p = _two_sample_p(with_spec, without)
    assert p > 1e-3, f"speculation changed the distribution (p={p:.2e})"


def test_a_broken_acceptance_rule_is_detected(setup, monkeypatch):
    model, prompt, without = setup
    monkeypatch.setattr(verify_module, "_accepts", lambda p_x, q_x, u: True)
    llm = LLM(str(model), speculative_config=SPEC, **ENGINE)
    p = _two_sample_p(_samples(llm, prompt, 0), without)
    assert p < 1e-6, f"a rule accepting every draft went unnoticed (p={p:.2e})"
