"""``block_wise_fp8``: FastDeploy's block-wise fp8 (e4m3) weights, per-token-group fp8 activations.

The scheme of FastDeploy's ``BlockWiseFP8LinearMethod`` (weights quantized by
``per_block_cast_to_fp8``, activations by ``per_token_quant_padding``, the
product by DeepGEMM's ``fp8_gemm_nt``), with FastDeploy's default
``weight_block_size`` ``[128, 128]``. It applies to every linear layer and
the routed experts (FastDeploy: ``BlockWiseFP8LinearMethod`` /
``BlockWiseFP8MoEMethod``); the LM head stays float.

Layout (``QuantizedWeight.qweight`` / ``.scales``):

- ``qweight`` uint8 ``[out, in]``: the e4m3fn bit pattern of each weight
  (sign, 4 exponent bits with bias 7, 3 mantissa bits; subnormals below
  2^-6; largest finite 448; 0x7F / 0xFF are NaN and never produced);
- ``scales`` float32 ``[ceil(out / 128), ceil(in / 128)]`` (FastDeploy's
  ``weight_scale_inv``, a multiplier despite the name):
  ``W[i, o] ~ e4m3(qweight[o, i]) * scales[o // 128, i // 128]``.

Weights, per 128 x 128 block of ``W^T`` (the last blocks partial, as if
zero-padded): ``amax = max(max |block|, 1e-4)``,
``q = e4m3_rne(w * (448 / amax))``, ``scale = amax / 448``.

Activations, on every call, per token and group of 128 inputs (the last
group partial): ``amax = max(max |x_group|, 1e-10)``, ``s = amax / 448``,
``xq = e4m3_rne(x / s)``.

Reference numerics: ``y[t, o] = sum_g (xq[t, g] . q[o, g]) * s[t, g] *
scales[o // 128, g]``, computed as ``(e4m3(xq) * s) @ (e4m3(q) * scales)^T``
in fp32 (the same sum with the scales applied before the products: equal up
to fp32 rounding). Rounding to e4m3 is round-to-nearest-even, as
``paddle``/``torch``'s ``float8_e4m3fn`` casts (``encode_e4m3``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core.quantization.methods import QuantMethod

__all__ = [
    "BLOCK",
    "BLOCK_WISE_FP8",
    "E4M3_MAX",
    "E4M3_VALUES",
    "block_fp8_linear",
    "decode_e4m3",
    "dequantize_block_fp8",
    "encode_e4m3",
    "quantize_activations_fp8",
    "quantize_block_fp8",
]

BLOCK = 128  # FastDeploy's weight_block_size [128, 128]; also the activation group
E4M3_MAX = 448.0
_WEIGHT_AMAX_FLOOR = 1e-4  # per_block_cast_to_fp8's clamp
_ACT_AMAX_FLOOR = 1e-10  # per_token_quant's epsilon


def _e4m3_table() -> np.ndarray:
    """float32 [256]: the value of each e4m3fn bit pattern (NaN for 0x7F, 0xFF)."""
    codes = np.arange(256)
    exponent, mantissa = (codes >> 3) & 0xF, codes & 0x7
    magnitude = np.where(exponent == 0, mantissa / 8.0 * 2.0**-6,
                         (1 + mantissa / 8.0) * 2.0 ** (exponent - 7.0))
    magnitude[(exponent == 15) & (mantissa == 7)] = np.nan
    return np.where(codes >= 128, -magnitude, magnitude).astype(np.float32)


E4M3_VALUES = _e4m3_table()
_POSITIVE = E4M3_VALUES[:127]  # codes 0..126: 0 .. 448, increasing


def encode_e4m3(values: np.ndarray) -> np.ndarray:
    """float32 -> uint8 e4m3fn bit patterns, round to nearest even, magnitudes
    above 448 saturated to 448 (callers scale into range first)."""
    v = np.asarray(values, dtype=np.float32)
    magnitude = np.minimum(np.abs(v), np.float32(E4M3_MAX))
    _, exp = np.frexp(magnitude)  # magnitude = m * 2**exp, m in [0.5, 1)
    step = np.ldexp(np.float32(1.0), np.maximum(exp - 1, -6) - 3).astype(np.float32)  # grid spacing there
    rounded = np.rint(magnitude / step) * step  # exact: step is a power of two
    codes = np.searchsorted(_POSITIVE, rounded).astype(np.uint8)
    return np.where(np.signbit(v), codes | np.uint8(0x80), codes).astype(np.uint8)


def decode_e4m3(codes: Any) -> Any:
    """uint8 e4m3fn bit patterns (numpy or paddle) -> float32 values, same shape."""
    if isinstance(codes, np.ndarray):
        return E4M3_VALUES[codes]
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    table = paddle.to_tensor(E4M3_VALUES, place=codes.place)
    return paddle.gather(table, codes.astype("int64").flatten()).reshape(codes.shape)


def _blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


def quantize_block_fp8(weight: np.ndarray, group_size: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """``weight [in, out]`` float -> (uint8 e4m3 ``[out, in]``, float32
    ``[ceil(out/128), ceil(in/128)]``). ``group_size`` is ignored: the block
    is FastDeploy's fixed 128 x 128."""
    if weight.ndim != 2 or 0 in weight.shape:
        raise ValueError(f"expected a non-empty [in, out] weight, got shape {list(weight.shape)}")
    in_f, out_f = (int(s) for s in weight.shape)
    ob, ib = _blocks(out_f), _blocks(in_f)
    padded = np.zeros((ob * BLOCK, ib * BLOCK), dtype=np.float32)
    padded[:out_f, :in_f] = weight.T
    view = padded.reshape(ob, BLOCK, ib, BLOCK)
    amax = np.maximum(np.abs(view).max(axis=(1, 3), keepdims=True), np.float32(_WEIGHT_AMAX_FLOOR))
    codes = encode_e4m3(view * (np.float32(E4M3_MAX) / amax)).reshape(padded.shape)[:out_f, :in_f]
    scales = (amax / np.float32(E4M3_MAX)).reshape(ob, ib).astype(np.float32)
    return np.ascontiguousarray(codes), scales


def _expand_scales(scales: Any, rows: int, cols: int) -> Any:
    """paddle ``[ceil(rows/128), ceil(cols/128)]`` -> ``[rows, cols]``."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    full = paddle.repeat_interleave(paddle.repeat_interleave(scales.astype("float32"), BLOCK, axis=0), BLOCK, axis=1)
    return full[:rows, :cols]


def dequantize_block_fp8(qweight: Any, scales: Any) -> Any:
    """uint8 ``[out, in]``, ``[ceil(out/128), ceil(in/128)]`` -> float32 ``[in, out]`` (paddle)."""
    out_f, in_f = (int(s) for s in qweight.shape)
    return (decode_e4m3(qweight) * _expand_scales(scales, out_f, in_f)).t()


def quantize_activations_fp8(x: Any) -> tuple[Any, Any]:
    """``x [T, in]`` (paddle) -> (e4m3 values as float32 ``[T, in]``, scales
    float32 ``[T, ceil(in/128)]``), as FastDeploy's ``per_token_quant``."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    tokens, in_f = (int(s) for s in x.shape)
    groups = _blocks(in_f)
    x = x.astype("float32")
    if groups * BLOCK != in_f:
        x = paddle.concat([x, paddle.zeros([tokens, groups * BLOCK - in_f], dtype="float32")], axis=1)
    grouped = x.reshape([tokens, groups, BLOCK])
    scales = paddle.clip(paddle.abs(grouped).max(axis=-1, keepdim=True), min=_ACT_AMAX_FLOOR) / E4M3_MAX
    scaled = paddle.clip(grouped / scales, -E4M3_MAX, E4M3_MAX)
    values = scaled.astype("float8_e4m3fn").astype("float32").reshape([tokens, groups * BLOCK])
    return values[:, :in_f], scales.squeeze(-1)


def block_fp8_linear(x: Any, quant: Any) -> Any:
    """Reference ``y = sum_g (xq_g . q_g) * s_g * scale_g`` in fp32, in ``x``'s dtype."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    if int(x.shape[0]) == 0:
        return paddle.zeros([0, quant.out_features], dtype=x.dtype)
    values, scales = quantize_activations_fp8(x)
    x_dq = values * paddle.repeat_interleave(scales, BLOCK, axis=1)[:, : values.shape[1]]
    w_dq = decode_e4m3(quant.qweight) * _expand_scales(quant.scales, quant.out_features, quant.in_features)
    out = paddle.matmul(x_dq, w_dq, transpose_y=True)  # [T, out]
    return out if out.dtype == x.dtype else out.astype(x.dtype)


BLOCK_WISE_FP8 = QuantMethod(
    "block_wise_fp8",
    "e4m3 weights in 128x128 blocks with fp32 block scales, per-token-group (128) dynamic e4m3 activations",
    quantize=quantize_block_fp8, linear=block_fp8_linear, dequantize=dequantize_block_fp8,
)
