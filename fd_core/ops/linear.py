"""Linear layers, unquantized and quantized.

Unquantized weights are ``[in, out]`` (Paddle's layout), so ``y = x @ W``.
Quantized layers carry a ``QuantizedWeight``; the layout and the reference
numerics of each method are defined by ``fd_core.quantization`` (wint8/wint4:
dequantize, then an fp32 matmul; w8a8: per-token dynamic int8 activations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fd_core._paddle import import_paddle

__all__ = ["QuantizedWeight", "reference_linear"]

paddle = import_paddle()


@dataclass
class QuantizedWeight:
    """A quantized linear weight as stored after loading (paddle tensors).

    wint8/w8a8: ``qweight`` int8 ``[out, in]``, ``scales`` float32 ``[out]``.
    wint4: ``qweight`` uint8 ``[out, in // 2]`` (two signed nibbles, low =
    even in-index), ``scales`` float32 ``[out, in // group_size]`` (``[out, 1]``
    and ``group_size`` -1 when per channel). Stacked MoE experts add a leading
    expert axis to both tensors; ``in_features``/``out_features`` are then one
    expert's. See ``fd_core.quantization.wint`` for the exact arithmetic.
    """

    method: str  # "wint8", "wint4", "w8a8", or a plugin's method
    qweight: Any  # packed integer weight, a row per output channel
    scales: Any  # float32 scales: [out] or [out, groups]
    in_features: int
    out_features: int
    group_size: int = -1  # -1: per channel


def reference_linear(x: Any, weight: Any, bias: Any | None = None, quant: Any = None) -> Any:
    """``x [T, in] @ weight [in, out] + bias``; with ``quant`` (and ``weight``
    None) the method's reference numerics; None for a method without them."""
    if quant is None:
        out = paddle.matmul(x, weight)
    else:
        from fd_core.quantization.methods import registry

        method = registry.find(quant.method)
        if method is None or method.linear is None:
            return None
        out = method.linear(x, quant)
    if bias is not None:
        out = out + bias
    return out
