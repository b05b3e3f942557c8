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
with static scales load as ``w4a8_static`` (below).

``w4a8_static`` (FastDeploy's offline W4A8C8 experts, ``fd_core.quantization.offline``):
the same int4 codes (per-channel, ``qweight`` uint8 ``[out, in // 2]``) and a
float32 ``scales`` ``[out, 2]``: column 0 the weight scale (FastDeploy's stored
``weight_scale`` is the channel's ``max |W|``, so ``s_w = weight_scale / 7``),
column 1 the expert's static activation ``max |x|`` ``a`` (its stored
``activation_scale``, the same in every row). Activations are quantized with
that fixed scale, as FastDeploy's dispatch does with ``in_scale = 1 / a``
(``QuantHelperFunc``: ``127 * in_scale * x``, rounded, clipped to +-127):

    xq = clip(rint(127 * x / a), -127, 127);   y = (xq @ (q * s_w)) * a / 127
"""

from __future__ import annotations

from typing import Any

from fd_core.quantization.methods import QuantMethod
from fd_core.quantization.wint import dequantize_int4, quantize_int4

__all__ = ["W4A8", "dequantize_w4a8_static", "w4a8_linear", "w4a8_static_linear"]


def w4a8_linear(x: Any, quant: Any) -> Any:
    """Reference ``y = (xq @ dequantize_int4(W)) * s_t`` in fp32, in ``x``'s dtype."""
    from fd_core._paddle import import_paddle
    from fd_core.quantization.w8a8 import quantize_activations

    paddle = import_paddle()
    codes, token_scales = quantize_activations(x)
    acc = paddle.matmul(codes, dequantize_int4(quant.qweight, quant.scales))  # [T, out]
    out = acc * token_scales.unsqueeze(-1)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


def dequantize_w4a8_static(qweight: Any, scales: Any) -> Any:
    """``w4a8_static``'s weight (paddle) -> float32 ``[in, out]`` (the activation scale aside)."""
    return dequantize_int4(qweight, scales[:, :1])


def w4a8_static_linear(x: Any, quant: Any) -> Any:
    """Reference ``y = (xq @ (q * s_w)) * a / 127`` with the static activation max ``a``, in ``x``'s dtype."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    amax = quant.scales[0, 1].astype("float32")
    codes = paddle.clip(paddle.round(x.astype("float32") * (127.0 / amax)), -127.0, 127.0)
    # paddle.round rounds half to even, as numpy's rint
    acc = paddle.matmul(codes, dequantize_w4a8_static(quant.qweight, quant.scales))
    out = acc * (amax / 127.0)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


W4A8 = QuantMethod(
    "w4a8", "int4 weights with group-wise scales (wint4's layout), per-token dynamic int8 activations",
    quantize=quantize_int4, linear=w4a8_linear, grouped=True, dequantize=dequantize_int4,
)
