"""Qwen3 (dense) against HF transformers' Qwen3ForCausalLM on the same generated checkpoint:
the model runner, ``LLM`` and the OpenAI server give HF's greedy tokens, logprobs within 1e-3."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fd_core.config import EngineArgs  # noqa: E402
from fd_core.engine.client import InprocEngineClient  # noqa: E402
from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.entrypoints.openai.api_server import ServerArgs, build_app  # noqa: E402
from fd_core.testing.greedy import greedy_generate  # noqa: E402
from fd_core.testing.qwen3_checkpoint import generate_qwen3_checkpoint  # noqa: E402

PROMPT_LENS = [1, 5, 16, 31, 47, 65]
NEW_TOKENS = 24
ATOL = 1e-3


def _prompts(seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 2000, n)] for n in PROMPT_LENS]  # BPE ids, no added tokens


def _hf_greedy(model_dir, prompts, new_tokens=NEW_TOKENS):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    tokens, logprobs = [], []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0,
            )
            new = out.sequences[0, len(prompt):].tolist()
            tokens.append(new)
            logprobs.append([float(torch.log_softmax(s[0].double(), -1)[t]) for s, t in zip(out.logits, new)])
    return tokens, logprobs


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def case(request, tmp_path_factory):
    tied = request.param
    path = generate_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3"), tie_word_embeddings=tied)
    prompts = _prompts()
    return path, prompts, _hf_greedy(path, prompts)


def test_runner_matches_hf(case, cpu_backend):
    path, prompts, (hf_tokens, hf_logprobs) = case
    runner = ModelRunner(path, cpu_backend, num_blocks=64, block_size=16)
    assert runner.config.head_dim * runner.config.num_heads != runner.config.hidden_size
    tokens, logprobs = greedy_generate(runner, prompts, NEW_TOKENS)
    for i, prompt in enumerate(prompts):
        assert tokens[i] == hf_tokens[i], f"prompt of {len(prompt)} tokens diverges"
        np.testing.assert_allclose(logprobs[i], hf_logprobs[i], atol=ATOL, rtol=0)
    assert len({t for seq in tokens for t in seq}) > 10  # a model stuck on one token would make this weak
    chunked, _ = greedy_generate(runner, prompts, 8, chunk_size=7)  # prefill chunks mixed with decodes
    assert chunked == [t[:8] for t in tokens]


def test_llm_matches_hf(case):
    from fd_core import LLM, SamplingParams

    path, prompts, (hf_tokens, hf_logprobs) = case
    llm = LLM(model=str(path), backend="cpu", max_model_len=256, num_gpu_blocks_override=64, block_size=16)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    for out, want, want_lp in zip(outs, hf_tokens, hf_logprobs):
        got = out.outputs[0]
        assert list(got.token_ids) == want
        lps = [entry[t].logprob for entry, t in zip(got.logprobs, got.token_ids)]
        np.testing.assert_allclose(lps, want_lp, atol=ATOL, rtol=0)
        assert got.text == hf_tok.decode(want, skip_special_tokens=True)


def test_server_chat_matches_hf(case):
    """A chat request through the OpenAI app: the prompt is Qwen3's template (thinking off) rendered
    as HF renders it, and the answer is HF's greedy continuation of those ids."""
    path, _, _ = case
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime number."}]
    prompt_text = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             enable_thinking=False)
    assert prompt_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    prompt_ids = hf_tok.encode(prompt_text, add_special_tokens=False)
    (want,), (want_lp,) = _hf_greedy(path, [prompt_ids], 12)

    client = InprocEngineClient(EngineArgs.from_kwargs(
        str(path), backend="cpu", max_model_len=256, num_gpu_blocks_override=64, block_size=16))
    app = build_app(client, ServerArgs(served_model_names=("qwen3",)))

    async def ask() -> dict:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as http:
            r = await http.post("/v1/chat/completions", json={
                "model": "qwen3", "messages": messages, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                "logprobs": True, "return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False},
            })
            assert r.status_code == 200, r.text
            return r.json()

    try:
        body = asyncio.run(ask())
    finally:
        asyncio.run(client.shutdown())
    choice = body["choices"][0]
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    assert choice.get("prompt_token_ids", prompt_ids) == prompt_ids
    assert choice["message"]["content"] == hf_tok.decode(want)
    lps = [c["logprob"] for c in choice["logprobs"]["content"]]
    np.testing.assert_allclose(lps, want_lp, atol=ATOL, rtol=0)


def test_x86_backend_gives_the_reference_tokens(case, cpu_backend):
    """fd_x86 runs Qwen3 through its per-op kernels (q/k norm as rms_norm rows, neox rotary)."""
    pytest.importorskip("fd_x86")
    from fd_x86 import backend as x86

    availability = x86.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    from fd_core.backends import get_backend

    path, prompts, _ = case
    # fp32 weights on both (x86's --dtype auto keeps this bf16 checkpoint's dtype, which changes the math)
    ref, _ = greedy_generate(ModelRunner(path, cpu_backend, num_blocks=64, block_size=16, dtype="float32"),
                             prompts, 12)
    got, _ = greedy_generate(ModelRunner(path, get_backend("x86"), num_blocks=64, block_size=16, dtype="float32"),
                             prompts, 12)
    assert got == ref
    assert not x86._build_failed  # the native kernels answered, not the reference behind them
