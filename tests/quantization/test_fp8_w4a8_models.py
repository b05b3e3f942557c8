"""block_wise_fp8 and w4a8 end to end on generated checkpoints (CPU reference),
and the refusal of a backend that lacks them."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from fd_core.errors import UnsupportedFeatureError
from fd_core.model_loader import load_model
from fd_core.model_loader.accounting import weight_bytes
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization import parse_quantization, quantize_weight

GREEDY = dict(temperature=0, ignore_eos=True)
W4A8_EXPERTS = {"quantization": "mix_quant", "dense_quant_type": "wint8", "moe_quant_type": "w4a8",
                "group_size": 32}


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("quantization", ["block_wise_fp8", "w4a8", W4A8_EXPERTS], ids=str)
def test_llm_runs(checkpoint_factory, shape, quantization):
    llm = LLM(str(checkpoint_factory(shape, "pytorch")), backend="cpu", quantization=quantization,
              max_model_len=128, num_gpu_blocks_override=32, block_size=16)
    runner = llm.engine.core.runner
    assert 0 < runner.weight_bytes < weight_bytes(runner.model, as_fp32=True)
    outs = llm.generate(["hello there", "the quick brown fox"], SamplingParams(max_tokens=6, **GREEDY),
                        use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)


def test_loading_quantizes_like_quantize_weight(cpu_backend, checkpoint_factory):
    model_dir = checkpoint_factory("tiny-moe", "paddle")
    fp32 = load_model(model_dir, cpu_backend.ops)
    quant = load_model(model_dir, cpu_backend.ops, quantization=parse_quantization("block_wise_fp8"))
    fp32_params = fp32.parameters()
    experts = 0
    for name, param in quant.parameters().items():
        if not isinstance(param.data, QuantizedWeight):
            continue
        assert param.data.method == "block_wise_fp8", name
        full = fp32_params[name].data.numpy()
        for e, weight in enumerate(full if full.ndim == 3 else [full]):
            want = quantize_weight("block_wise_fp8", weight)
            qweight = param.data.qweight[e] if full.ndim == 3 else param.data.qweight
            scales = param.data.scales[e] if full.ndim == 3 else param.data.scales
            np.testing.assert_array_equal(qweight.numpy(), want.qweight.numpy(), err_msg=name)
            np.testing.assert_array_equal(scales.numpy(), want.scales.numpy(), err_msg=name)
        experts += full.ndim == 3
    assert experts >= 2


@pytest.mark.parametrize("method", ["block_wise_fp8", "w4a8"])
def test_a_backend_without_the_method_refuses_by_name(checkpoint_factory, monkeypatch, method):
    from fd_core.backends.base import Backend
    from fd_core.plugins.types import Capabilities

    monkeypatch.setattr(Backend, "capabilities", lambda self: Capabilities(quantization_methods=("wint8", "wint4")))
    with pytest.raises(UnsupportedFeatureError,
                       match=f"backend 'cpu' cannot run {method}; its quantization methods: wint8, wint4"):
        LLM(str(checkpoint_factory("tiny-dense", "pytorch")), backend="cpu", quantization=method,
            num_gpu_blocks_override=8)
