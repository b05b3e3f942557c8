"""A reduced ERNIE-4.5-21B-A3B (every feature of its config, small widths) against HF transformers.

tiny-moe covers top-2 of 8 experts and one shared expert; the 21B adds what
this shape keeps: top-6 of 64 experts, two shared experts, the correction
bias, GQA groups of 5 (20 heads / 4 KV heads), a 103424-token tied
vocabulary past the 2048 trained pieces, rope theta 500000.
(benchmarks/moe_oracle.py runs the same comparison with llama.cpp too.)
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.testing.greedy import greedy_generate  # noqa: E402

REDUCED_21B = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 20,
    "num_key_value_heads": 4, "head_dim": 16, "moe_intermediate_size": 16, "moe_layer_end_index": 2,
    "max_position_embeddings": 512,
}
NEW_TOKENS = 12


def _hf_greedy(model_dir, prompts):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens, logprobs = [], []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False, output_logits=True, return_dict_in_generate=True,
                                 eos_token_id=None, pad_token_id=0)
            new = out.sequences[0, len(prompt):].tolist()
            tokens.append(new)
            logprobs.append([float(torch.log_softmax(s[0].double(), -1)[t]) for s, t in zip(out.logits, new)])
    return tokens, logprobs


@pytest.fixture(scope="module")
def case(checkpoint_factory):
    path = checkpoint_factory("21b-a3b", "pytorch", **REDUCED_21B)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(100, 2048, n)] for n in (1, 7, 33)]
    return path, prompts, _hf_greedy(path, prompts)


def test_config_keeps_the_21b_features(case):
    import json

    cfg = json.loads((case[0] / "config.json").read_text())
    assert (cfg["moe_num_experts"], cfg["moe_k"], cfg["moe_num_shared_experts"]) == (64, 6, 2)
    assert cfg["tie_word_embeddings"] and cfg["vocab_size"] == 103424 and cfg["moe_layer_start_index"] == 1


def test_cpu_backend_matches_hf(case, cpu_backend):
    path, prompts, (hf_tokens, hf_logprobs) = case
    runner = ModelRunner(path, cpu_backend, num_blocks=32, block_size=16, dtype="float32")
    tokens, logprobs = greedy_generate(runner, prompts, NEW_TOKENS)
    assert tokens == hf_tokens
    np.testing.assert_allclose(np.concatenate(logprobs), np.concatenate(hf_logprobs), atol=1e-3, rtol=0)


def test_x86_backend_matches_hf(case):
    pytest.importorskip("fd_x86")
    from fd_x86 import backend as x86

    availability = x86.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    from fd_core.backends import get_backend

    path, prompts, (hf_tokens, hf_logprobs) = case
    runner = ModelRunner(path, get_backend("x86"), num_blocks=32, block_size=16, dtype="float32")
    tokens, logprobs = greedy_generate(runner, prompts, NEW_TOKENS)
    assert tokens == hf_tokens
    np.testing.assert_allclose(np.concatenate(logprobs), np.concatenate(hf_logprobs), atol=1e-3, rtol=0)
    assert not x86._build_failed
