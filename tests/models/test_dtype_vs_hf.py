"""16-bit weights (``--dtype bfloat16|float16``) on the CPU reference against HF transformers.

The oracle: on random weights bf16 rounding flips greedy tokens, so HF runs
in fp32 with its weights rounded to the storage dtype (the reference's
definition: 16-bit weights, fp32 compute). Two ways in: a checkpoint stored
in the 16-bit dtype (HF upcasts it on load), and an fp32 checkpoint that our
loader rounds (HF's weights rounded with torch, the router gate kept fp32 as
the loader keeps it).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.testing.greedy import greedy_generate  # noqa: E402

PROMPT_LENS = [1, 9, 33, 70]
NEW_TOKENS = 16
LOGPROB_ATOL = 1e-3  # the same compute (fp32) on the same weights: only summation order differs
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [[int(t) for t in rng.integers(100, vocab, n)] for n in PROMPT_LENS]


def _hf_greedy(model_dir, prompts, round_to: str | None):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if round_to is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".mlp.gate." not in name and "moe_statics" not in name:  # the router stays fp32
                    p.copy_(p.to(TORCH_DTYPES[round_to]).float())
    tokens, logprobs = [], []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                do_sample=False, output_logits=True, return_dict_in_generate=True,
                eos_token_id=None, pad_token_id=0,
            )
            new = out.sequences[0, len(prompt):].tolist()
            tokens.append(new)
            logprobs.append([float(torch.log_softmax(s[0].double(), -1)[t]) for s, t in zip(out.logits, new)])
    return tokens, logprobs


def _check(runner, model_dir, round_to):
    prompts = _prompts(runner.config.vocab_size)
    tokens, logprobs = greedy_generate(runner, prompts, NEW_TOKENS)
    hf_tokens, hf_logprobs = _hf_greedy(model_dir, prompts, round_to)
    for i, prompt in enumerate(prompts):
        assert tokens[i] == hf_tokens[i], f"prompt of {len(prompt)} tokens diverges from HF"
        np.testing.assert_allclose(logprobs[i], hf_logprobs[i], atol=LOGPROB_ATOL, rtol=0)
    assert len({t for seq in tokens for t in seq}) > 5  # not a degenerate model


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe", "tiny-qwen3"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_checkpoint_stored_in_16_bits_matches_hf(checkpoint_factory, cpu_backend, shape, dtype):
    model_dir = checkpoint_factory(shape, "pytorch", dtype=dtype)
    runner = ModelRunner(model_dir, cpu_backend, num_blocks=48, block_size=16, dtype=dtype)
    assert runner.dtype == dtype
    assert runner.model.embed_tokens.data.dtype == getattr(__import__("paddle"), dtype)
    _check(runner, model_dir, None)


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe", "tiny-qwen3"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fp32_checkpoint_rounded_on_load_matches_hf_rounded(checkpoint_factory, cpu_backend, shape, dtype):
    model_dir = checkpoint_factory(shape, "pytorch", dtype="float32")
    runner = ModelRunner(model_dir, cpu_backend, num_blocks=48, block_size=16, dtype=dtype)
    _check(runner, model_dir, dtype)
