"""Quantizing one weight, dequantizing it, and what quantized weights cost.

``quantize_weight`` is the reference quantizer: it fixes the layout that
the reference kernels (and every backend's kernels) read. Stacked expert
weights are ``QuantizedWeight``s whose tensors carry a leading expert axis;
``expert_weight`` takes one expert's slice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization.methods import registry
from fd_core.quantization.wint import dequantize_int4, dequantize_int8

__all__ = ["dequantize", "expert_weight", "quantize_array", "quantize_weight", "resident_bytes"]

paddle = import_paddle()

_INT8_LAYOUT = ("wint8", "w8a8")


def _method(name: str) -> Any:
    method = registry.find(name)
    if method is None:
        raise ValueError(
            f"unknown quantization method {name!r}; implemented: {', '.join(registry.names(True))}"
        )
    if not method.implemented:
        raise ValueError(f"quantization method {name!r}: {registry.refusal(name)}")
    return method


def quantize_array(method: str, weight: np.ndarray, group_size: int = 128) -> tuple[np.ndarray, np.ndarray, int]:
    """``weight [in, out]`` -> (qweight, scales, group size used) as numpy arrays."""
    impl = _method(method)
    weight = np.asarray(weight, dtype=np.float32)
    qweight, scales = impl.quantize(weight, group_size)
    groups = int(scales.shape[-1]) if impl.grouped and scales.ndim == 2 else 1
    used = -1 if groups == 1 else int(weight.shape[0]) // groups
    return qweight, scales, used


def quantize_weight(method: str, weight: Any, group_size: int = 128) -> QuantizedWeight:
    """Quantize a float32 ``weight [in, out]`` (numpy array or paddle tensor)
    with ``method`` ("wint8", "wint4", "w8a8", or a plugin's); ``group_size``
    applies to grouped methods (wint4; -1 = per channel)."""
    array = weight.numpy() if hasattr(weight, "numpy") else np.asarray(weight)
    if array.ndim != 2:
        raise ValueError(f"quantize_weight expects a [in, out] weight, got shape {list(array.shape)}")
    qweight, scales, used = quantize_array(method, array, group_size)
    in_f, out_f = (int(s) for s in array.shape)
    return QuantizedWeight(method, paddle.to_tensor(qweight), paddle.to_tensor(scales), in_f, out_f, used)


def dequantize(quant: QuantizedWeight) -> Any:
    """The float32 ``[in, out]`` weight a quantized one stands for (paddle)."""
    out_f, in_f = quant.out_features, quant.in_features
    if quant.method in _INT8_LAYOUT:
        _check_layout(quant, [out_f, in_f], "int8", [[out_f]])
        return dequantize_int8(quant.qweight, quant.scales)
    if quant.method == "wint4":
        groups = 1 if quant.group_size == -1 else in_f // quant.group_size
        _check_layout(quant, [out_f, in_f // 2], "uint8", [[out_f, groups]])
        return dequantize_int4(quant.qweight, quant.scales)
    method = registry.find(quant.method)
    if method is not None and method.dequantize is not None:  # a layout of its own (block_fp8, w4a8, ...)
        return method.dequantize(quant.qweight, quant.scales)
    raise ValueError(f"no dequantizer for quantization method {quant.method!r}")


def _check_layout(quant: QuantizedWeight, qshape: list[int], qdtype: str, scale_shapes: list[list[int]]) -> None:
    if (list(quant.qweight.shape) != qshape or str(quant.qweight.dtype).split(".")[-1] != qdtype
            or list(quant.scales.shape) not in scale_shapes):
        raise ValueError(
            f"{quant.method} weight [in={quant.in_features}, out={quant.out_features}, group_size="
            f"{quant.group_size}] must be {qdtype} {qshape} with scales {scale_shapes[0]}; got "
            f"{quant.qweight.dtype} {list(quant.qweight.shape)} with scales {list(quant.scales.shape)}"
        )


def expert_weight(stacked: QuantizedWeight, expert: int) -> QuantizedWeight:
    """Expert ``expert``'s weight from one stacked over a leading expert axis."""
    return stacked.expert(expert)


def resident_bytes(value: Any) -> int:
    """Bytes a loaded parameter holds: a paddle tensor, or a QuantizedWeight's
    packed weight plus scales; 0 for None."""
    if value is None:
        return 0
    if isinstance(value, QuantizedWeight):
        return resident_bytes(value.qweight) + resident_bytes(value.scales)
    return int(np.prod(value.shape)) * int(value.element_size())
