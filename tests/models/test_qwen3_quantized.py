"""Qwen3 with --quantization: the generic load-time transform quantizes its linears, and the
result is exactly the reference numerics (dequantize, then an fp32 matmul) of those weights."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.engine.model_runner import ModelRunner
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization import dequantize, parse_quantization
from fd_core.testing.greedy import greedy_generate
from fd_core.testing.qwen3_checkpoint import generate_qwen3_checkpoint

PROMPTS = [[5, 9, 13], [int(t) for t in np.random.default_rng(1).integers(100, 2000, 40)]]


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def model_dir(request, tmp_path_factory):
    return generate_qwen3_checkpoint(tmp_path_factory.mktemp("q3"), tie_word_embeddings=request.param)


def _linears(model):
    for layer in model.layers:
        yield from (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.up_gate_proj, layer.mlp.down_proj)


@pytest.mark.parametrize("method", [
    "wint8", "wint4", {"quantization": "wint8", "lm_head_quant_type": "wint8"}], ids=["wint8", "wint4", "wint8-head"])
def test_quantized_qwen3_is_the_reference_numerics_of_its_weights(model_dir, cpu_backend, method):
    quant = ModelRunner(model_dir, cpu_backend, num_blocks=32, block_size=16,
                        quantization=parse_quantization(method))
    model = quant.model
    assert all(isinstance(linear.weight.data, QuantizedWeight) for linear in _linears(model))
    head_quantized = isinstance(method, dict)
    assert isinstance(model.lm_head.weight.data, QuantizedWeight) == head_quantized
    fp32 = ModelRunner(model_dir, cpu_backend, num_blocks=32, block_size=16)
    assert quant.weight_bytes < fp32.weight_bytes
    # the same model with every quantized weight replaced by its dequantized fp32 values
    targets = list(_linears(fp32.model)) + ([fp32.model.lm_head] if head_quantized else [])
    sources = list(_linears(model)) + ([model.lm_head] if head_quantized else [])
    for dst, src in zip(targets, sources):
        dst.weight.data = dequantize(src.weight.data)
    tokens, logprobs = greedy_generate(quant, PROMPTS, 8)
    ref_tokens, ref_logprobs = greedy_generate(fp32, PROMPTS, 8)
    assert tokens == ref_tokens
    np.testing.assert_allclose(np.concatenate(logprobs), np.concatenate(ref_logprobs), atol=1e-4)


def test_x86_gives_the_reference_tokens_quantized(model_dir, cpu_backend):
    pytest.importorskip("fd_x86")
    from fd_x86 import backend as x86_backend

    availability = x86_backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    from fd_core.backends import get_backend

    x86 = get_backend("x86")
    x86.set_device(0)
    q = parse_quantization("wint8")
    ref = greedy_generate(ModelRunner(model_dir, cpu_backend, num_blocks=32, block_size=16, quantization=q),
                          PROMPTS, 8)[0]
    assert greedy_generate(ModelRunner(model_dir, x86, num_blocks=32, block_size=16, quantization=q),
                           PROMPTS, 8)[0] == ref
