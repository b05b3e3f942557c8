"""The model shapes ``benchmarks/llama_cpp.py`` compares, and each one's rows.

A shape names a checkpoint generator (``fd_core.testing.checkpoints``,
PyTorch naming: the files llama.cpp's converter reads, and fd-core loads the
same files), the llama.cpp GGUF types to make from it, and the fd-core
configurations, each paired with the llama.cpp row of equal weight bits for
the ratio columns (fp32 / f32, int8 / q8_0, int4 / q4_0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MID_MOE", "SHAPES", "FdConfig", "Shape", "with_lm_head"]

# the mid-size MoE: hidden 1024, 4 layers (1 dense + 3 MoE), 16 experts top-4, expert width 768,
# 1 shared expert; 16 heads x 64 (2 KV heads); the dense layer 3072 wide (as benchmarks/moe_decode.py)
MID_MOE: dict[str, Any] = {
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 4, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 64, "moe_num_experts": 16, "moe_k": 4, "moe_intermediate_size": 768,
    "moe_num_shared_experts": 1, "moe_layer_start_index": 1, "moe_layer_end_index": 3, "moe_layer_interval": 1,
    "moe_capacity": [16, 16, 16],
}
_ALL_INT4 = json.dumps({"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4"})
# all-int4 with the LM head int4 too: a llama.cpp q4_0 file quantizes its output tensor (q6_K), FastDeploy's
# mix_quant keeps it float (the all-int4 row): this row reads no more than q4_0 does
_ALL_INT4_HEAD = json.dumps({**json.loads(_ALL_INT4), "lm_head_quant_type": "wint4"})
# the rows of llama.cpp's own arithmetic and bytes: q8_0 / q4_0 multiply their weights with activations
# quantized to int8 per 32 values (q8_0) and quantize the output tensor too; w8a8 / w4a8 take per-token int8
# activations, and these rows quantize the head with the layers' method
_WINT8_HEAD = json.dumps({"quantization": "wint8", "lm_head_quant_type": "wint8"})
_W8A8_HEAD = json.dumps({"quantization": "w8a8", "lm_head_quant_type": "w8a8"})
_W4A8_HEAD = json.dumps({"quantization": "w4a8", "lm_head_quant_type": "w4a8"})
# the opt-in int8-activation prefill (fd_x86: calls of 32+ rows, prefill chunks and B >= 32 decode steps,
# run wint8 / wint4 linears and experts on per-token int8 activations; it changes numerics)
_INT8_ACT = {"FD_X86_PREFILL_INT8_ACT": "1"}


@dataclass(frozen=True)
class FdConfig:
    """One fd-core row: its label after "fd-core <backend> ", engine keyword arguments, the paired GGUF type."""

    name: str  # "wint8", "mix_quant all-int4", ...
    engine_kwargs: dict[str, Any]  # LLM(...) keywords: quantization, dtype
    pair: str  # the llama.cpp type of equal weight bits: "f32", "q8_0", "q4_0"
    env: dict[str, str] = field(default_factory=dict)  # set around the row's measurements (fd_x86 switches)


@dataclass(frozen=True)
class Shape:
    """A model shape: how to generate it and which rows to measure."""

    title: str  # the table's first header cell
    generator: str  # fd_core.testing.checkpoints shape
    seed: int
    overrides: dict[str, Any] = field(default_factory=dict)
    llama_types: tuple[str, ...] = ("q8_0", "q4_0")  # GGUF types measured (f32 is always converted)
    fd_configs: tuple[FdConfig, ...] = ()


_DENSE_ROWS = (
    FdConfig("fp32", {"dtype": "float32"}, "f32"),
    FdConfig("wint8", {"quantization": "wint8"}, "q8_0"),
    FdConfig("mix_quant all-int4", {"quantization": _ALL_INT4}, "q4_0"),
    FdConfig("w8a8", {"quantization": "w8a8"}, "q8_0"),
    FdConfig("all-int4 + int4 head", {"quantization": _ALL_INT4_HEAD}, "q4_0"),
    FdConfig("wint8 + int8 head", {"quantization": _WINT8_HEAD}, "q8_0"),
    FdConfig("w8a8 + w8a8 head", {"quantization": _W8A8_HEAD}, "q8_0"),
    FdConfig("w4a8 + w4a8 head", {"quantization": _W4A8_HEAD}, "q4_0"),
    FdConfig("all-int4, int8-act prefill", {"quantization": _ALL_INT4}, "q4_0", _INT8_ACT),
)
_MOE_ROWS = (
    FdConfig("wint8", {"quantization": "wint8"}, "q8_0"),
    FdConfig("wint4 (experts int4)", {"quantization": "wint4"}, "q4_0"),
    FdConfig("w8a8", {"quantization": "w8a8"}, "q8_0"),
    FdConfig("mix_quant all-int4", {"quantization": _ALL_INT4}, "q4_0"),
    FdConfig("w4a8", {"quantization": "w4a8"}, "q4_0"),
    FdConfig("w4a8 + w4a8 head", {"quantization": _W4A8_HEAD}, "q4_0"),
    FdConfig("wint4, int8-act prefill", {"quantization": "wint4"}, "q4_0", _INT8_ACT),
    FdConfig("all-int4, int8-act prefill", {"quantization": _ALL_INT4}, "q4_0", _INT8_ACT),
)
_MOE_TITLE = ("mid-size MoE (hidden 1024, 4 layers: 1 dense + 3 MoE, 16 experts top-4, width 768, 1 shared)")
SHAPES: dict[str, Shape] = {
    "0.3b": Shape("ERNIE-4.5-0.3B shape", "0.3b", 0, {}, ("f32", "q8_0", "q4_0"), _DENSE_ROWS),
    "mid-moe": Shape(_MOE_TITLE, "tiny-moe", 3, MID_MOE, ("q8_0", "q4_0"), _MOE_ROWS),
    # --quick: the test shapes (seconds per round)
    "tiny-dense": Shape("tiny-dense (hidden 64, 2 layers)", "tiny-dense", 0, {}, ("f32", "q8_0", "q4_0"),
                        _DENSE_ROWS),
    "tiny-moe": Shape("tiny-moe (hidden 64, 3 layers: 1 dense + 2 MoE, 8 experts top-2)", "tiny-moe", 0, {},
                      ("q8_0", "q4_0"), _MOE_ROWS),
}


def with_lm_head(engine_kwargs: dict[str, Any], lm_head: str) -> dict[str, Any]:
    """``engine_kwargs`` with the LM head quantized too when ``lm_head`` is "int8" (float: unchanged).

    The engine keeps the head float by default (FastDeploy's default);
    llama.cpp's q8_0 / q4_0 recipes quantize it (q8_0 / q6_K), so
    ``--lm-head int8`` gives the closer comparison of bytes read. A row that
    names its own head (``lm_head_quant_type``: the all-int4 + int4 head row)
    keeps it.
    """
    if lm_head == "float" or "quantization" not in engine_kwargs:
        return dict(engine_kwargs)
    if lm_head != "int8":
        raise ValueError(f"lm_head must be 'float' or 'int8', got {lm_head!r}")
    raw = engine_kwargs["quantization"]
    value = json.loads(raw) if isinstance(raw, str) and raw.startswith("{") else {"quantization": raw}
    if "lm_head_quant_type" in value:
        return dict(engine_kwargs)
    value["lm_head_quant_type"] = "w8a8" if value["quantization"] == "w8a8" else "wint8"
    return {**engine_kwargs, "quantization": value}
