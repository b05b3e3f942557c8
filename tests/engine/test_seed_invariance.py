"""Seeded requests through the engine: given the same logits, each request
samples the same tokens alone, in a batch of 32, under preemption and with
chunked prefill, for both sampling methods.

The model's own logits are not bit-identical across batch compositions on
the CPU backends (their matmuls round a row differently with the step's row
count; README "Seeds and batch invariance"), so here each row's logits are
replaced by a function of its request's token history: what is tested is
everything between the logits and the tokens (sampler, per-request
generators across steps, preemption and recompute, chunked prefill)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core import LLM, SamplingParams
from fd_core.sampling.sampler import Sampler

MAX_TOKENS = 16


def _history_logits(tokens: list[int], vocab: int) -> np.ndarray:
    """A row that depends on the request's history only (its length and last tokens)."""
    rng = np.random.default_rng([len(tokens), *tokens[-3:]])
    return rng.normal(0, 2, vocab).astype(np.float32)


@pytest.fixture
def history_logits(monkeypatch):
    sample = Sampler.sample

    def from_history(self, logits, requests, token_bitmask=None):
        rows = [_history_logits(list(s.prompt_token_ids) + s.output_token_ids, int(logits.shape[1]))
                for s in requests]
        return sample(self, paddle.to_tensor(np.stack(rows)), requests, token_bitmask)

    monkeypatch.setattr(Sampler, "sample", from_history)


@pytest.fixture(scope="module")
def dense(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


def _requests() -> tuple[list[list[int]], list[SamplingParams]]:
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 2048, int(rng.integers(1, 150)))] for _ in range(32)]
    params = [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, seed=7 + 13 * i, temperature=1.0,
                             top_p=0.9, top_k=(0, 50)[i % 2], min_p=(0.0, 0.05)[i % 3 == 0])
              for i in range(32)]
    return prompts, params


def _llm(model_dir, method: str, **engine_args) -> LLM:
    args = dict(backend="cpu", max_model_len=512, max_num_seqs=32, num_gpu_blocks_override=128, block_size=16)
    llm = LLM(str(model_dir), **{**args, **engine_args})
    llm.engine.core.sampler.method = method
    return llm


def _tokens(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("method", ["sort", "rejection"])
def test_seeded_requests_alone_batched_preempted_and_chunked_agree(dense, history_logits, method):
    prompts, params = _requests()
    llm = _llm(dense, method)
    together = _tokens(llm, prompts, params)
    assert len({tuple(t) for t in together}) == 32  # the seeds do differ
    alone = [_tokens(llm, [p], [sp])[0] for p, sp in zip(prompts, params)]
    assert [i for i in range(32) if alone[i] != together[i]] == []
    preempting = _llm(dense, method, num_gpu_blocks_override=24, max_num_batched_tokens=64)
    assert _tokens(preempting, prompts, params) == together
    assert preempting.engine.core.scheduler.num_preemptions > 0
    chunked = _llm(dense, method, max_num_batched_tokens=16, max_num_seqs=5)
    assert _tokens(chunked, prompts[::-1], params[::-1]) == together[::-1]
