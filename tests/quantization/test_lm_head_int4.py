"""The int4 LM head (``lm_head_quant_type: wint4``): quantized on load from the
same fp32 matrix as ``quantize_weight`` (tied or not), with the group size
of the rest, beside int4 dense layers (mix_quant) or int8 ones (wint4 on ERNIE)."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.model_loader import load_model
from fd_core.quantization.config import parse_quantization
from fd_core.quantization.weights import quantize_weight


@pytest.mark.parametrize("shape,naming", [("tiny-dense", "paddle"), ("tiny-dense", "pytorch")])
@pytest.mark.parametrize("spec,dense", [
    ({"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4",
      "lm_head_quant_type": "wint4", "group_size": 32}, "wint4"),
    ({"quantization": "wint4", "lm_head_quant_type": "wint4", "group_size": 32}, "wint8"),  # ERNIE: dense int8
])
def test_int4_lm_head_is_quantized_like_quantize_weight(cpu_backend, checkpoint_factory, shape, naming, spec,
                                                        dense) -> None:
    model_dir = checkpoint_factory(shape, naming)
    config = parse_quantization(spec, "Ernie4_5ForCausalLM")
    assert config is not None
    assert config.lm_head_method == "wint4" and config.dense_method == dense
    assert "lm_head wint4" in config.describe()
    fp32 = load_model(model_dir, cpu_backend.ops)
    quant = load_model(model_dir, cpu_backend.ops, quantization=config)
    head = quant.lm_head.quant
    assert head is not None and head.method == "wint4" and head.group_size == 32
    want = quantize_weight("wint4", fp32.lm_head.weight.data.numpy(), 32)
    np.testing.assert_array_equal(head.qweight.numpy(), want.qweight.numpy())
    np.testing.assert_array_equal(head.scales.numpy(), want.scales.numpy())
    assert quant.layers[0].self_attn.qkv_proj.quant.method == dense
    np.testing.assert_array_equal(quant.embed_tokens.data.numpy(), fp32.embed_tokens.data.numpy())
