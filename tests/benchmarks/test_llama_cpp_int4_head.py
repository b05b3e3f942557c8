"""benchmarks/llama_cpp_shapes.py's "all-int4 + int4 head" row: the dense
shapes measure mix_quant all-int4 with the LM head int4 too (a llama.cpp
q4_0 file quantizes its output tensor; FastDeploy's default keeps it float),
paired with q4_0, and ``--lm-head int8`` leaves that row's head alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import llama_cpp_shapes as shapes  # noqa: E402


def _row(shape: str, name: str) -> shapes.FdConfig:
    return next(c for c in shapes.SHAPES[shape].fd_configs if c.name == name)


def test_dense_shapes_have_an_all_int4_row_with_an_int4_head() -> None:
    for shape in ("0.3b", "tiny-dense"):
        row = _row(shape, "all-int4 + int4 head")
        assert row.pair == "q4_0"
        spec = json.loads(row.engine_kwargs["quantization"])
        assert spec == {"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4",
                        "lm_head_quant_type": "wint4"}
        # the float-head all-int4 row stays as it was, beside it
        assert "lm_head_quant_type" not in json.loads(_row(shape, "mix_quant all-int4").engine_kwargs["quantization"])


def test_lm_head_int8_keeps_a_row_that_names_its_own_head() -> None:
    row = _row("0.3b", "all-int4 + int4 head")
    assert shapes.with_lm_head(row.engine_kwargs, "int8") == row.engine_kwargs
    assert shapes.with_lm_head(row.engine_kwargs, "float") == row.engine_kwargs


def test_the_row_parses_as_an_int4_head() -> None:
    from fd_core.quantization import parse_quantization

    spec = json.loads(_row("0.3b", "all-int4 + int4 head").engine_kwargs["quantization"])
    config = parse_quantization(spec, "Ernie4_5_ForCausalLM")
    assert config is not None and config.dense_method == "wint4" and config.lm_head_method == "wint4"
