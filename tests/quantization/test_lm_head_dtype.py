"""The LM head follows FastDeploy: stored in the model's dtype (``--dtype``),
never quantized by ``--quantization`` alone; ``--lm_head-fp32`` keeps it fp32."""

from __future__ import annotations

import numpy as np
import paddle

from fd_core import LLM
from fd_core.model_loader import load_model
from fd_core.model_loader.safetensors_io import SafetensorsFile
from fd_core.quantization import parse_quantization


def _untied(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "paddle", dtype="float32", tie_word_embeddings=False)


def test_head_takes_the_model_dtype_and_stays_unquantized(cpu_backend, checkpoint_factory):
    model = load_model(_untied(checkpoint_factory), cpu_backend.ops, quantization=parse_quantization("wint8"),
                       dtype="bfloat16")
    assert model.lm_head.quant is None and model.lm_head.weight.data.dtype == paddle.bfloat16
    assert model.layers[0].self_attn.qkv_proj.quant.method == "wint8"


def test_lm_head_fp32_keeps_the_checkpoint_values(cpu_backend, checkpoint_factory):
    model_dir = _untied(checkpoint_factory)
    stored = SafetensorsFile(next(model_dir.glob("*.safetensors"))).get("lm_head.weight")
    model = load_model(model_dir, cpu_backend.ops, quantization=parse_quantization("wint8"), dtype="bfloat16",
                       lm_head_fp32=True)
    head = model.lm_head.weight.data
    assert head.dtype == paddle.float32
    np.testing.assert_array_equal(head.numpy(), stored)  # not rounded through bf16
    assert model.embed_tokens.data.dtype == paddle.bfloat16  # the rest keeps --dtype
    assert model.layers[0].input_layernorm.weight.data.dtype == paddle.bfloat16


def test_the_engine_passes_the_flag(checkpoint_factory):
    llm = LLM(str(_untied(checkpoint_factory)), backend="cpu", dtype="bfloat16", lm_head_fp32=True,
              max_model_len=64, num_gpu_blocks_override=8, block_size=16)
    assert llm.engine.core.runner.model.lm_head.weight.data.dtype == paddle.float32


def test_lm_head_fp32_makes_a_tied_head_an_fp32_copy(cpu_backend, checkpoint_factory):
    """A head tied to the embeddings (the ERNIE 0.3B's) under --dtype bfloat16: the flag gives
    it its own fp32 copy of the table as stored (bf16-rounded values), the table stays bf16."""
    model_dir = checkpoint_factory("tiny-dense", "paddle", dtype="float32")
    model = load_model(model_dir, cpu_backend.ops, quantization=None, dtype="bfloat16", lm_head_fp32=True)
    head, table = model.lm_head.weight.data, model.embed_tokens.data
    assert model.config.tie_word_embeddings and head.dtype == paddle.float32 and table.dtype == paddle.bfloat16
    np.testing.assert_array_equal(head.numpy(), table.astype("float32").numpy().T)


def test_quantized_weights_record_the_models_activation_dtype(cpu_backend, checkpoint_factory):
    """``QuantizedWeight.act_dtype`` is ``--dtype`` (a backend may round activations to it at the
    linear); the weights themselves stay codes and fp32 scales."""
    model_dir = _untied(checkpoint_factory)
    quant = parse_quantization(
        '{"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4", '
        '"lm_head_quant_type": "wint8"}')
    for dtype in ("bfloat16", "float32", "float16"):
        model = load_model(model_dir, cpu_backend.ops, quantization=quant, dtype=dtype)
        qkv, head = model.layers[0].self_attn.qkv_proj.quant, model.lm_head.quant
        assert (qkv.method, qkv.act_dtype, head.method, head.act_dtype) == ("wint4", dtype, "wint8", dtype)
        assert qkv.scales.dtype == paddle.float32
    tied = checkpoint_factory("tiny-dense", "paddle", dtype="float32", tie_word_embeddings=True)
    for dtype in ("bfloat16", "float32"):  # a head tied to the table is filled after loading, from it
        model = load_model(tied, cpu_backend.ops, quantization=quant, dtype=dtype)
        assert (model.lm_head.quant.method, model.lm_head.quant.act_dtype) == ("wint8", dtype)
    from fd_core.ops.linear import QuantizedWeight

    stacked = QuantizedWeight("wint4", paddle.zeros([2, 4, 8], "uint8"), paddle.ones([2, 4, 1]), 16, 4, -1, "bfloat16")
    assert stacked.expert(1).act_dtype == "bfloat16"  # an expert's slice keeps it
