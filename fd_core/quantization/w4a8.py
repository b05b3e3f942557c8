"""``w4a8``: int4 weights with group scales, per-token dynamic int8 activations.

Weights are stored exactly as ``wint4`` (``fd_core.quantization.wint``):
uint8 ``[out, in // 2]`` (two signed nibbles, low = even input index, codes
in ``[-7, 7]``), float32 scales ``[out, in // group_size]`` (``[out, 1]``
per channel; ``scale = max |W| over the group / 7``). Activations are
quantized on every call as ``w8a8`` does, one scale per token:
``s_t = max |x_t| / 127`` (1 for a zero row), ``xq = clip(rint(x / s_t), -127, 127)``.

    y[t, o] = s_t * sum_g scales[o, g] * sum_{i in g} xq[t, i] * q[o, i]

The inner sums are exact integers (int8 x int4, at most 127 * 7 per product:
what a VNNI kernel computes in int32 per group); the reference computes
``(xq @ dequantize_int4(W)) * s_t`` in fp32, the group scale applied to each
code before the sum (equal up to fp32 rounding).

FastDeploy's ``w4a8`` (``CutlassW4A8MoEMethod``) applies to MoE experts only
and reads per-expert static activation scales from offline-quantized
checkpoints (W4A8C8); fd-core's computes the activation scale per token on
the fly, so a float checkpoint quantizes at load, and it quantizes every
linear layer the method is given (use the ``mix_quant`` form,
``"moe_quant_type": "w4a8"``, for FastDeploy's split). Offline checkpoints
with static scales are not read yet (issue 22 item 4).
"""

from __future__ import annotations

from typing import Any

from fd_core.quantization.methods import QuantMethod
from fd_core.quantization.wint import dequantize_int4, quantize_int4

__all__ = ["W4A8", "w4a8_linear"]


def w4a8_linear(x: Any, quant: Any) -> Any:
    """Reference ``y = (xq @ dequantize_int4(W)) * s_t`` in fp32, in ``x``'s dtype."""
    from fd_core._paddle import import_paddle
    from fd_core.quantization.w8a8 import quantize_activations

    paddle = import_paddle()
    codes, token_scales = quantize_activations(x)
    acc = paddle.matmul(codes, dequantize_int4(quant.qweight, quant.scales))  # [T, out]
    out = acc * token_scales.unsqueeze(-1)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


W4A8 = QuantMethod(
    "w4a8", "int4 weights with group-wise scales (wint4's layout), per-token dynamic int8 activations",
    quantize=quantize_int4, linear=w4a8_linear, grouped=True, dequantize=dequantize_int4,
)
