"""Linear layers, unquantized and quantized.

Unquantized weights are ``[in, out]`` (Paddle's layout), so ``y = x @ W``.
Quantized layers carry a ``QuantizedWeight``; the reference numerics of each
method are defined by ``fd_core.quantization`` (dequantize, then fp32 matmul).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fd_core._paddle import import_paddle

__all__ = ["QuantizedWeight", "reference_linear"]

paddle = import_paddle()


@dataclass
class QuantizedWeight:
    """A quantized linear weight as stored after loading."""

    method: str  # "wint8", "wint4", "w8a8", ...
    qweight: Any  # packed integer weight; layout owned by the method
    scales: Any  # per-output-channel [out] or group-wise [in/group, out] scales
    in_features: int
    out_features: int
    group_size: int = -1  # -1: per channel


def reference_linear(x: Any, weight: Any, bias: Any | None = None, quant: Any = None) -> Any:
    """``x [T, in] @ weight [in, out] + bias``; None for quantized weights the
    reference has no numerics for yet (the caller reports it)."""
    if quant is not None:
        return None
    out = paddle.matmul(x, weight)
    if bias is not None:
        out = out + bias
    return out
