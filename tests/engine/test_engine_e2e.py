"""The engine end to end on generated checkpoints: outputs do not depend on
prefix caching, chunking, preemption, swapping or batch composition."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core import LLM, SamplingParams

MAX_TOKENS = 12


def _prompts(n: int = 32, seed: int = 0, vocab: int = 2048) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    shared = [int(t) for t in rng.integers(100, vocab, 70)]
    prompts = []
    for i in range(n):
        length = int(rng.integers(1, 150))
        own = [int(t) for t in rng.integers(100, vocab, length)]
        # every third prompt shares a 70-token prefix, so prefix caching matters
        prompts.append(shared + own if i % 3 == 0 else own)
    return prompts


def _run(model_dir, prompts, params, **engine_args) -> list[list[int]]:
    args = dict(backend="cpu", max_model_len=512, max_num_seqs=32, num_gpu_blocks_override=128,
                block_size=16)
    args.update(engine_args)
    llm = LLM(str(model_dir), **args)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
SEEDED = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.9, top_k=50, seed=1000 + i,
                         ignore_eos=True) for i in range(32)]

CONDITIONS = {
    "no-prefix-cache": dict(enable_prefix_caching=False),
    "chunk-16": dict(max_num_batched_tokens=16),
    "chunk-37": dict(max_num_batched_tokens=37),
    "no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=512),
    "preemption": dict(num_gpu_blocks_override=24, max_num_batched_tokens=64),
    "preemption-with-swap": dict(num_gpu_blocks_override=24, swap_space=0.001),
    "few-seqs": dict(max_num_seqs=3),
}


@pytest.fixture(scope="module")
def dense(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


@pytest.fixture(scope="module")
def baseline(dense):
    prompts = _prompts()
    return prompts, _run(dense, prompts, GREEDY), _run(dense, prompts, SEEDED)


@pytest.mark.parametrize("condition", sorted(CONDITIONS))
def test_outputs_do_not_depend_on_engine_settings(dense, baseline, condition):
    prompts, greedy, seeded = baseline
    assert _run(dense, prompts, GREEDY, **CONDITIONS[condition]) == greedy
    assert _run(dense, prompts, SEEDED, **CONDITIONS[condition]) == seeded


def test_alone_equals_in_a_batch_of_32(dense, baseline):
    prompts, greedy, seeded = baseline
    for i in (0, 5, 31):
        assert _run(dense, [prompts[i]], GREEDY) == [greedy[i]]
        assert _run(dense, [prompts[i]], [SEEDED[i]]) == [seeded[i]]


def test_moe_model_under_preemption(checkpoint_factory):
    moe = checkpoint_factory("tiny-moe", "paddle")
    prompts = _prompts(12, seed=3)
    base = _run(moe, prompts, GREEDY)
    assert _run(moe, prompts, GREEDY, num_gpu_blocks_override=12, max_num_batched_tokens=40) == base


def test_shared_prefix_reuses_cached_blocks(dense):
    llm = LLM(str(dense), backend="cpu", max_model_len=1024, block_size=16, num_gpu_blocks_override=128)
    rng = np.random.default_rng(5)
    prefix = [int(t) for t in rng.integers(100, 2048, 200)]
    first = llm.generate([prefix + [101, 102]], GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    core = llm.engine.core
    before = core.scheduler.kv_cache_manager.prefix_cache_stats.hits
    llm.engine.add_request("second", prefix + [103, 104, 105], GREEDY)
    outputs = llm.engine.step()
    # the first step of the second request computed only the tokens after the cached blocks
    cached = (200 // 16) * 16
    assert core.last_step.num_prefill_tokens == len(prefix) + 3 - cached
    while llm.engine.has_unfinished_requests():
        outputs += llm.engine.step()
    final = [o for o in outputs if o.finished][0]
    assert final.num_cached_tokens == cached
    assert core.scheduler.kv_cache_manager.prefix_cache_stats.hits - before == cached


def test_every_block_is_free_after_the_run(dense):
    llm = LLM(str(dense), backend="cpu", max_model_len=512, block_size=16, num_gpu_blocks_override=40)
    llm.generate(_prompts(10, seed=9), GREEDY, use_tqdm=False)
    pool = llm.engine.core.scheduler.kv_cache_manager
    assert pool.usage == 0.0


def test_evicted_prefix_comes_back_from_the_host_tier(dense):
    rng = np.random.default_rng(11)
    prefix = [int(t) for t in rng.integers(100, 2048, 96)]
    target = prefix + [7, 8, 9]
    fillers = [[int(t) for t in rng.integers(100, 2048, 100)] for _ in range(4)]
    expected = _run(dense, [target], GREEDY)
    llm = LLM(str(dense), backend="cpu", max_model_len=512, block_size=16,
              num_gpu_blocks_override=16, swap_space=0.01)
    llm.generate([prefix + [1]], GREEDY, use_tqdm=False)
    llm.generate(fillers, GREEDY, use_tqdm=False)  # evicts the prefix's blocks to host
    pool = llm.engine.core.scheduler.kv_cache_manager
    assert pool.pool.num_swap_outs > 0
    out = llm.generate([target], GREEDY, use_tqdm=False)[0]
    assert pool.pool.num_swap_ins > 0
    assert out.num_cached_tokens >= 80
    assert [out.outputs[0].token_ids] == expected


def test_prompt_logprobs_cover_the_whole_prompt_after_a_prefix_cache_hit(dense):
    from fd_core import LLM, SamplingParams

    llm = LLM(str(dense), backend="cpu", max_model_len=512, num_gpu_blocks_override=64, block_size=16)
    prompt = list(range(5, 205))  # 200 tokens: 12 full blocks cached after the first run
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1)
    warm = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)[0]
    assert warm.num_cached_tokens == 0
    first, second = (llm.generate([prompt], params, use_tqdm=False)[0] for _ in range(2))
    for out in (first, second):
        assert len(out.prompt_logprobs) == 200 and out.prompt_logprobs[0] is None
        assert all(p is not None for p in out.prompt_logprobs[1:])
    assert [p[t].logprob for p, t in zip(first.prompt_logprobs[1:], prompt[1:])] == \
        [p[t].logprob for p, t in zip(second.prompt_logprobs[1:], prompt[1:])]
    again = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)[0]
    assert again.num_cached_tokens == 192  # the prefix stays cached for requests without prompt logprobs
