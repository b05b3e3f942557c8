"""--quantization forms, refused methods, and the backend capability check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fd_core import LLM
from fd_core.config import EngineArgs, UnsupportedFeatureError
from fd_core.quantization import QuantizationConfig, QuantMethod, parse_quantization, registry


@pytest.mark.parametrize("value,method,dense,moe,group", [
    ("wint8", "wint8", "wint8", "wint8", 128),
    ("W8A8", "w8a8", "w8a8", "w8a8", 128),
    ('{"quantization": "wint4", "group_size": 64}', "wint4", "wint4", "wint4", 64),
    ({"quantization": "wint4", "group_size": -1}, "wint4", "wint4", "wint4", -1),
    ({"quantization": "mix_quant", "dense_quant_type": "wint8", "moe_quant_type": "wint4"},
     "mix_quant", "wint8", "wint4", 128),
])
def test_forms(value, method, dense, moe, group):
    config = parse_quantization(value)
    assert (config.method, config.dense_method, config.moe_method, config.group_size) == (method, dense, moe, group)


@pytest.mark.parametrize("value,head", [
    ("wint8", None), ("wint4", None), ("w8a8", None),  # float by default, as in FastDeploy
    ({"quantization": "wint8", "lm_head_quant_type": "wint8"}, "wint8"),
    ({"quantization": "w8a8", "lm_head_quant_type": "wint8"}, "wint8"),
    ({"quantization": "wint8", "lm_head_quant_type": "none"}, None),
    ({"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4",
      "lm_head_quant_type": "wint4"}, "wint4"),
])
def test_lm_head_method(value, head):
    config = parse_quantization(value, "Ernie4_5ForCausalLM")
    assert config.lm_head_method == head
    assert (head or "float") in config.describe()
    if head:
        assert head in config.methods(has_experts=False)


def test_lm_head_fp32_keeps_the_head_float_and_refuses_an_explicit_head_method():
    assert parse_quantization("w8a8", lm_head_fp32=True).lm_head_method is None
    with pytest.raises(ValueError, match="--lm_head-fp32 keeps the LM head float.*'wint8'"):
        parse_quantization({"quantization": "wint8", "lm_head_quant_type": "wint8"}, lm_head_fp32=True)
    config = parse_quantization({"quantization": "wint8", "lm_head_quant_type": "none"}, lm_head_fp32=True)
    assert config.lm_head_method is None


def test_bad_lm_head_method_is_named():
    with pytest.raises(ValueError, match="lm_head_quant_type must be a method name, got 3"):
        parse_quantization({"quantization": "wint8", "lm_head_quant_type": 3})
    with pytest.raises(ValueError, match="unknown method 'int3'"):
        parse_quantization({"quantization": "wint8", "lm_head_quant_type": "int3"})


@pytest.mark.parametrize("value", [None, "", "none"])
def test_unquantized(value):
    assert parse_quantization(value) is None


def test_wint4_on_ernie_keeps_dense_layers_at_wint8():
    for arch in ("Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM"):
        config = parse_quantization("wint4", arch)
        assert (config.dense_method, config.moe_method) == ("wint8", "wint4")
        assert config.methods(has_experts=False) == ("wint8",)
    mixed = parse_quantization({"quantization": "mix_quant", "dense_quant_type": "wint4",
                                "moe_quant_type": "wint4"}, "Ernie4_5ForCausalLM")
    assert mixed.dense_method == "wint4"
    assert parse_quantization("wint4", "Qwen3ForCausalLM").dense_method == "wint4"


@pytest.mark.parametrize("value,message", [
    ("tensor_wise_fp8", r"--quantization tensor_wise_fp8: tensor-wise fp8 is not implemented.*w4afp8"),
    ("wint2", r"--quantization wint2: wint2 \(FastDeploy's 2-bit MoE experts\) comes only from offline-quantized "
              r"checkpoints.*no --quantization needed"),
    ({"quantization": "mix_quant", "dense_quant_type": "wint8", "moe_quant_type": "wint2"}, "wint2"),
])
def test_unimplemented_fastdeploy_methods_are_refused(value, message):
    with pytest.raises(UnsupportedFeatureError, match=message):
        parse_quantization(value)


@pytest.mark.parametrize("value,message", [
    ("int3", "unknown method 'int3'; implemented: block_wise_fp8, w4a8, w4afp8, w8a8, wint4, wint8"),
    ('{"quantization": ', "not valid JSON"),
    ({"group_size": 64}, "needs a 'quantization' key"),
    ({"quantization": "wint4", "group_size": 0}, "group_size must be -1 .* got 0"),
    ({"quantization": "wint4", "group_size": 33}, "group_size must be -1 .* got 33"),
    ({"quantization": "wint4", "bits": 4}, "unknown key.*bits"),
    ({"quantization": "wint8", "moe_quant_type": "wint4"}, "moe_quant_type applies only with"),
    ({"quantization": "mix_quant", "dense_quant_type": "wint8"}, "mix_quant needs moe_quant_type"),
])
def test_bad_values_are_named(value, message):
    with pytest.raises(ValueError, match=message):
        parse_quantization(value)


def test_engine_args_accept_implemented_methods_and_refuse_others():
    EngineArgs.from_kwargs("m", quantization="wint8")
    EngineArgs.from_kwargs("m", quantization={"quantization": "wint4", "group_size": 64})
    with pytest.raises(UnsupportedFeatureError, match="--quantization wint2"):
        EngineArgs.from_kwargs("m", quantization="wint2")


def test_validating_the_flag_imports_no_paddle():
    code = ("import sys; from fd_core.config import EngineArgs; "
            "EngineArgs.from_kwargs('m', quantization='wint4'); print('paddle' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_backend_without_the_method_refuses_at_startup(checkpoint_factory):
    model = str(checkpoint_factory("tiny-dense", "pytorch"))
    with pytest.raises(UnsupportedFeatureError) as info:
        LLM(model, backend="toy", quantization="wint8", num_gpu_blocks_override=8)
    message = str(info.value)
    assert "backend 'toy' cannot run wint8" in message and "its quantization methods: none" in message


def test_the_refusal_lists_what_the_backend_supports(checkpoint_factory, monkeypatch):
    from fd_core.backends.base import Backend
    from fd_core.plugins.types import Capabilities

    monkeypatch.setattr(Backend, "capabilities", lambda self: Capabilities(quantization_methods=("wint8",)))
    model = str(checkpoint_factory("tiny-moe", "paddle"))
    with pytest.raises(UnsupportedFeatureError,
                       match=r"wint4 \(dense wint8, experts wint4.*backend 'cpu' cannot run wint4; "
                             r"its quantization methods: wint8"):
        LLM(model, backend="cpu", quantization="wint4", num_gpu_blocks_override=8)


def test_plugins_can_add_methods(monkeypatch):
    from fd_core.quantization.wint import WINT8

    monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    registry.register("myint8", QuantMethod("myint8", "a plugin's int8", WINT8.quantize, WINT8.linear))
    registry.register("myfp6", QuantMethod("myfp6", "not yet", refused="myfp6 is still being written"))
    assert parse_quantization("myint8") == QuantizationConfig("myint8", "myint8", "myint8")
    assert "myint8" in registry.names(implemented=True)
    with pytest.raises(UnsupportedFeatureError, match="myfp6 is still being written"):
        parse_quantization("myfp6")
