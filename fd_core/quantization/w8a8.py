"""``w8a8``: int8 weights and per-token dynamic int8 activations.

Weights are stored exactly as wint8 (int8 ``[out, in]``, float32 scales
``[out]``, symmetric per output channel). Activations are quantized on every
call, one scale per token (row of ``x``):

    s_t = max_i |x[t, i]| / 127          (a row of zeros: s_t = 1)
    xq  = clip(rint(x / s_t), -127, 127)
    y   = (xq @ qweight^T) * s_t[:, None] * scales[None, :]

The reference computes everything in fp32, multiplying the integer sum by
``s_t`` first, then by ``scales``. The integer sums are exact in int32 on
native kernels; here they are exact in fp32 while every partial sum stays
below 2^24 in magnitude (always for ``in <= 1040``; for larger ``in`` random
signs keep real sums far below it, and an inexact sum is off by one part in
2^24 at most, well inside any kernel tolerance).
"""

from __future__ import annotations

from typing import Any

from fd_core.quantization.methods import QuantMethod
from fd_core.quantization.wint import quantize_int8

__all__ = ["W8A8", "quantize_activations", "w8a8_linear"]


def quantize_activations(x: Any) -> tuple[Any, Any]:
    """``x [T, in]`` -> (codes ``[T, in]`` as float32 integers in [-127, 127],
    scales ``[T]`` float32), per-token symmetric (paddle)."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    x = x.astype("float32")
    amax = paddle.abs(x).max(axis=-1)
    scales = paddle.where(amax > 0, amax / 127.0, paddle.ones_like(amax))
    codes = paddle.clip(paddle.round(x / scales.unsqueeze(-1)), -127.0, 127.0)  # round: half to even
    return codes, scales


def w8a8_linear(x: Any, quant: Any) -> Any:
    """Reference ``y = (xq @ qweight^T) * s_t * scales`` in fp32, in ``x``'s dtype."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    codes, token_scales = quantize_activations(x)
    acc = paddle.matmul(codes, quant.qweight.astype("float32"), transpose_y=True)  # [T, out]
    out = acc * token_scales.unsqueeze(-1) * quant.scales.astype("float32").unsqueeze(0)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


W8A8 = QuantMethod(
    "w8a8", "int8 weights per output channel, per-token dynamic int8 activations",
    quantize=quantize_int8, linear=w8a8_linear,
)
