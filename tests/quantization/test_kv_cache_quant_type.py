"""FastDeploy's ``kv_cache_quant_type`` and ``--kv-cache-dtype``: mapping,
resolution of ``auto``, disagreements and backends that lack a dtype."""

from __future__ import annotations

import pytest

from fd_core.config import UnsupportedFeatureError
from fd_core.quantization.config import (
    kv_cache_dtype_from_quantization,
    parse_quantization,
    resolve_kv_cache_dtype,
)

ALL = ("float32", "bfloat16", "float16", "int8", "fp8")


@pytest.mark.parametrize("quant_type,kv_dtype", [("int8", "int8"), ("float8_e4m3fn", "fp8"),
                                                  ("block_wise_fp8", "fp8"), ("none", None)])
def test_fastdeploy_kv_cache_quant_types_map_to_kv_dtypes(quant_type, kv_dtype):
    value = {"quantization": "wint8", "kv_cache_quant_type": quant_type}
    assert kv_cache_dtype_from_quantization(value) == kv_dtype
    config = parse_quantization(value)
    assert config is not None and config.dense_method == "wint8" and config.kv_cache_dtype == kv_dtype
    if kv_dtype:
        assert f"kv cache {kv_dtype}" in config.describe()


def test_kv_cache_quant_type_alone_leaves_the_weights_float():
    value = '{"kv_cache_quant_type": "block_wise_fp8"}'
    assert parse_quantization(value) is None
    assert kv_cache_dtype_from_quantization(value) == "fp8"
    assert kv_cache_dtype_from_quantization("wint8") is None
    assert kv_cache_dtype_from_quantization(None) is None


def test_unknown_kv_cache_quant_type_is_named():
    with pytest.raises(ValueError, match="kv_cache_quant_type must be one of int8, float8_e4m3fn, "
                                         "block_wise_fp8, got 'int4'"):
        parse_quantization({"quantization": "wint8", "kv_cache_quant_type": "int4"})


def test_auto_resolves_to_fastdeploys_form_else_the_model_dtype_else_float32():
    assert resolve_kv_cache_dtype("auto", None, "cpu", ALL) == "float32"
    assert resolve_kv_cache_dtype("auto", None, "cpu", ALL, model_dtype="bfloat16") == "bfloat16"
    assert resolve_kv_cache_dtype("auto", None, "b", ("float32",), model_dtype="bfloat16") == "float32"
    assert resolve_kv_cache_dtype("auto", {"kv_cache_quant_type": "int8"}, "cpu", ALL) == "int8"
    assert resolve_kv_cache_dtype("fp8", {"kv_cache_quant_type": "float8_e4m3fn"}, "cpu", ALL) == "fp8"
    assert resolve_kv_cache_dtype("float16", "wint8", "cpu", ALL) == "float16"


def test_flags_that_disagree_are_refused():
    with pytest.raises(ValueError, match="--kv-cache-dtype fp8 and --quantization kv_cache_quant_type "
                                         r"\(int8\) disagree"):
        resolve_kv_cache_dtype("fp8", {"quantization": "wint8", "kv_cache_quant_type": "int8"}, "cpu", ALL)


def test_a_dtype_the_backend_does_not_declare_is_refused_naming_both():
    with pytest.raises(UnsupportedFeatureError, match="--kv-cache-dtype int8: backend 'acme' has no KV cache "
                                                      "in int8; its KV-cache dtypes: float32, bfloat16"):
        resolve_kv_cache_dtype("int8", None, "acme", ("float32", "bfloat16"))
    with pytest.raises(UnsupportedFeatureError, match="backend 'acme'"):
        resolve_kv_cache_dtype("auto", '{"kv_cache_quant_type": "int8"}', "acme", ("float32",))
