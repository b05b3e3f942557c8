"""ERNIE 4.5 on the CPU backend against HF transformers on the same checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.testing.greedy import greedy_generate  # noqa: E402

PROMPT_LENS = [1, 5, 16, 31, 47, 64, 65, 90]
NEW_TOKENS = 32


def _prompts(vocab: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # skip the lowest ids (special tokens) so prompts look like text
    return [[int(t) for t in rng.integers(100, vocab, n)] for n in PROMPT_LENS]


def _hf_greedy(model_dir, prompts):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens, logprobs = [], []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                do_sample=False, output_logits=True, return_dict_in_generate=True,
                eos_token_id=None, pad_token_id=0,
            )
            new = out.sequences[0, len(prompt):].tolist()
            lps = [float(torch.log_softmax(step[0].double(), -1)[t]) for step, t in zip(out.logits, new)]
            tokens.append(new)
            logprobs.append(lps)
    return tokens, logprobs


@pytest.fixture(scope="module", params=["tiny-dense", "tiny-moe"])
def case(request, checkpoint_factory, cpu_backend):
    shape = request.param
    pt_dir = checkpoint_factory(shape, "pytorch")
    runner = ModelRunner(pt_dir, cpu_backend, num_blocks=64, block_size=16)
    prompts = _prompts(runner.config.vocab_size)
    ours = greedy_generate(runner, prompts, NEW_TOKENS)
    return shape, pt_dir, runner, prompts, ours


def test_greedy_tokens_and_logprobs_match_hf(case):
    shape, pt_dir, _, prompts, (tokens, logprobs) = case
    hf_tokens, hf_logprobs = _hf_greedy(pt_dir, prompts)
    for i, prompt in enumerate(prompts):
        assert tokens[i] == hf_tokens[i], f"{shape}: prompt of {len(prompt)} tokens diverges"
        np.testing.assert_allclose(logprobs[i], hf_logprobs[i], atol=1e-3, rtol=0)
    # a random model that always emits one token would make this test weak
    assert len({t for seq in tokens for t in seq}) > 10


def test_paddle_naming_loads_the_same_model(case, checkpoint_factory, cpu_backend):
    shape, _, _, prompts, (tokens, logprobs) = case
    runner = ModelRunner(checkpoint_factory(shape, "paddle"), cpu_backend, num_blocks=64, block_size=16)
    paddle_tokens, paddle_logprobs = greedy_generate(runner, prompts, NEW_TOKENS)
    assert paddle_tokens == tokens
    np.testing.assert_allclose(np.concatenate(paddle_logprobs), np.concatenate(logprobs), atol=1e-5)


def test_alone_equals_batched(case):
    _, _, runner, prompts, (tokens, _) = case
    for i in (0, 3, 7):
        alone, _ = greedy_generate(runner, [prompts[i]], NEW_TOKENS)
        assert alone[0] == tokens[i]


@pytest.mark.parametrize("chunk", [1, 7, 16, 33])
def test_chunked_prefill_equals_whole(case, chunk):
    _, _, runner, prompts, (tokens, _) = case
    chunked, _ = greedy_generate(runner, prompts, 8, chunk_size=chunk)
    assert chunked == [t[:8] for t in tokens]


def test_block_size_does_not_change_tokens(case, cpu_backend):
    _, pt_dir, _, prompts, (tokens, _) = case
    runner = ModelRunner(pt_dir, cpu_backend, num_blocks=20, block_size=64)
    out, _ = greedy_generate(runner, prompts, 8)
    assert out == [t[:8] for t in tokens]
