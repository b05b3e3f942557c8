"""Quantizing while loading generated checkpoints, and running them end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from fd_core.layers.mlp import MoE
from fd_core.model_loader import load_model
from fd_core.model_loader.accounting import weight_bytes
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization import parse_quantization, quantize_weight

ROOT = Path(__file__).resolve().parents[2]
GREEDY = dict(temperature=0, ignore_eos=True)
MIX_WINT4 = {"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4",
             "group_size": 32}


@pytest.mark.parametrize("shape,naming", [("tiny-dense", "pytorch"), ("tiny-moe", "paddle"),
                                          ("tiny-moe", "pytorch")])
@pytest.mark.parametrize("quantization", ["wint8", "w8a8", "wint4", MIX_WINT4], ids=str)
def test_loading_quantizes_each_weight_like_quantize_weight(cpu_backend, checkpoint_factory, shape, naming,
                                                            quantization):
    """Filling piece by piece (q/k/v and gate/up slices, expert by expert) gives
    the codes of quantizing the finished fp32 weight; what stays fp32 stays fp32."""
    model_dir = checkpoint_factory(shape, naming)
    config = parse_quantization(quantization)
    fp32 = load_model(model_dir, cpu_backend.ops)
    quant = load_model(model_dir, cpu_backend.ops, quantization=config)
    resolved = config.for_architecture(quant.config.architecture)
    fp32_params, quant_params = fp32.parameters(), quant.parameters()
    checked = 0
    for name, param in quant_params.items():
        data = param.data
        if name.endswith(("embed_tokens", "norm", "layernorm", "gate", "e_score_correction_bias")):
            assert not isinstance(data, QuantizedWeight), name
            np.testing.assert_array_equal(data.numpy(), fp32_params[name].data.numpy())
            continue
        assert isinstance(data, QuantizedWeight), name
        method = resolved.moe_method if ".experts." in name else resolved.dense_method
        assert data.method == method, name
        full = fp32_params[name].data.numpy()
        matrices = [(full[e], data.qweight[e], data.scales[e]) for e in range(full.shape[0])] \
            if full.ndim == 3 else [(full, data.qweight, data.scales)]
        for weight, qweight, scales in matrices:
            want = quantize_weight(method, weight, resolved.group_size)
            np.testing.assert_array_equal(qweight.numpy(), want.qweight.numpy(), err_msg=name)
            np.testing.assert_array_equal(scales.numpy(), want.scales.numpy(), err_msg=name)
        checked += 1
    assert checked >= 4
    # the LM head (tied or not) stays float by default, as in FastDeploy
    assert resolved.lm_head_method is None and quant.lm_head.quant is None
    np.testing.assert_array_equal(quant.lm_head.weight.data.numpy(), fp32.lm_head.weight.data.numpy())
    assert weight_bytes(quant) < weight_bytes(fp32) == weight_bytes(quant, as_fp32=True)


@pytest.mark.parametrize("shape,naming", [("tiny-dense", "paddle"), ("tiny-dense", "pytorch"),
                                          ("tiny-moe", "paddle")])
@pytest.mark.parametrize("head", ["wint8", "w8a8"])
def test_opt_in_lm_head_quant_type_quantizes_the_head_like_quantize_weight(cpu_backend, checkpoint_factory,
                                                                           shape, naming, head):
    """``lm_head_quant_type`` quantizes the head (tied or not) from the same fp32 matrix."""
    model_dir = checkpoint_factory(shape, naming)
    config = parse_quantization({"quantization": "wint8", "lm_head_quant_type": head})
    fp32 = load_model(model_dir, cpu_backend.ops)
    quant = load_model(model_dir, cpu_backend.ops, quantization=config)
    quantized = quant.lm_head.quant
    assert quantized is not None and quantized.method == head
    want = quantize_weight(head, fp32.lm_head.weight.data.numpy(), config.group_size)
    np.testing.assert_array_equal(quantized.qweight.numpy(), want.qweight.numpy())
    np.testing.assert_array_equal(quantized.scales.numpy(), want.scales.numpy())
    np.testing.assert_array_equal(quant.embed_tokens.data.numpy(), fp32.embed_tokens.data.numpy())


def test_big_matrices_quantize_in_slices_to_the_same_codes(monkeypatch):
    from fd_core.quantization import param as param_module

    rng = np.random.default_rng(3)
    weight = rng.standard_normal((64, 200)).astype(np.float32)
    for method in ("wint8", "w8a8", "wint4"):
        whole = param_module._quantize_in_slices(method, weight, 32)
        monkeypatch.setattr(param_module, "_SLICE_ELEMENTS", 64 * 16)  # slices of 16 output channels
        sliced = param_module._quantize_in_slices(method, weight, 32)
        monkeypatch.undo()
        for a, b in zip(whole[:2], sliced[:2]):
            np.testing.assert_array_equal(a, b)
        assert whole[2] == sliced[2]


def test_moe_layers_hold_stacked_expert_weights(cpu_backend, checkpoint_factory):
    model = load_model(checkpoint_factory("tiny-moe", "paddle"), cpu_backend.ops,
                       quantization=parse_quantization("wint4"))
    moe = next(layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE))
    up_gate, down = moe.expert_quant
    c = model.config
    assert up_gate.qweight.shape == [c.num_experts, 2 * c.moe_intermediate_size, c.hidden_size // 2]
    assert down.scales.shape == [c.num_experts, c.hidden_size, 1]  # in 32 < group 128: per channel
    assert (up_gate.in_features, up_gate.out_features) == (c.hidden_size, 2 * c.moe_intermediate_size)
    assert moe.shared_experts.up_gate_proj.quant.method == "wint8"  # dense layers under ERNIE wint4


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("quantization", ["wint8", "wint4", "w8a8", json.dumps(MIX_WINT4)])
def test_llm_runs_quantized(checkpoint_factory, shape, quantization):
    llm = LLM(str(checkpoint_factory(shape, "pytorch")), backend="cpu", quantization=quantization,
              max_model_len=128, num_gpu_blocks_override=32, block_size=16)
    runner = llm.engine.core.runner
    assert 0 < runner.weight_bytes < weight_bytes(runner.model, as_fp32=True)
    outs = llm.generate(["hello there", "the quick brown fox"], SamplingParams(max_tokens=6, **GREEDY),
                        use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)


@pytest.mark.slow
def test_agreement_script_reports_every_method():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quant_agreement.py"), "--json", "--prompts", "8",
         "--tokens", "8", "--shapes", "tiny-dense"], capture_output=True, text=True, check=True, cwd=ROOT)
    rows = {r["method"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(rows) == {"wint8", "wint4", "w8a8", "wint4-all"}
    for r in rows.values():
        assert 0 <= r["prefix"] <= 1 and r["weight_bytes"] < r["fp32_bytes"]
    assert rows["wint8"]["top1"] > 0.8 and rows["wint8"]["dlogprob_mean"] < 0.2


SCRIPT = r"""
import resource, sys
from fd_core.backends import get_backend
from fd_core.model_loader import load_model
from fd_core.model_loader.accounting import weight_bytes
from fd_core.quantization import parse_quantization
backend = get_backend("cpu"); backend.set_device(0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model = load_model(sys.argv[1], backend.ops, quantization=parse_quantization(sys.argv[2]))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((peak - before) * 1024, weight_bytes(model), weight_bytes(model, as_fp32=True))
"""


@pytest.mark.slow
def test_peak_memory_of_quantized_loading_stays_below_the_fp32_model(checkpoint_factory):
    model_dir = checkpoint_factory("0.3b", "paddle")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model_dir), "wint8"], capture_output=True,
                         text=True, check=True)
    peak, resident, fp32 = map(int, out.stdout.split()[-3:])
    assert resident < 0.65 * fp32
    # never the fp32 model and the quantized one at once: the fp32 model alone is more
    assert peak < fp32, f"loading peaked at {peak / 2**30:.2f} GiB; fp32 weights are {fp32 / 2**30:.2f} GiB"


def test_quantize_model_walks_any_layer_class_and_refuses_a_model_with_nothing_to_quantize(cpu_backend):
    """The load-time transform reaches linears in plugin-defined classes and lists; a model with
    none is refused by name rather than accepted and left unquantized."""
    from fd_core.errors import UnsupportedFeatureError
    from fd_core.layers.basic import Linear
    from fd_core.quantization import parse_quantization
    from fd_core.quantization.apply import quantize_model

    class Block:  # defined here, not in fd_core: as a plugin model's would be
        def __init__(self):
            self.proj = Linear(cpu_backend.ops, 8, 8)
            self.heads = [Linear(cpu_backend.ops, 8, 4), 3, "x"]
            self.scale = 1.5

    class Model:
        def __init__(self, layers):
            self.layers = layers
            self.lm_head = Linear(cpu_backend.ops, 8, 16)

    q = parse_quantization("wint8").for_architecture("Plugin")
    model = Model([Block(), Block()])
    quantize_model(model, q)
    for block in model.layers:
        assert hasattr(block.proj.weight, "method") and hasattr(block.heads[0].weight, "method")
    assert not hasattr(model.lm_head.weight, "method")  # the head stays float unless asked
    with pytest.raises(UnsupportedFeatureError, match="no Linear or MoE layer"):
        quantize_model(Model([object()]), q)
