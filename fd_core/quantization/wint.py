"""Weight-only int8 (``wint8``) and int4 (``wint4``): activations stay float.

Layouts (the contract native kernels are written against):

- wint8: ``qweight`` int8 ``[out, in]`` (a row per output channel,
  contiguous), ``scales`` float32 ``[out]``, symmetric:
  ``scales[o] = max_i |W[i, o]| / 127``, ``q = clip(rint(W / scale), -127, 127)``,
  so ``W[i, o] ~ qweight[o, i] * scales[o]``.
- wint4: ``qweight`` uint8 ``[out, in // 2]``; byte ``j`` of row ``o`` holds
  in-index ``2j`` in its low nibble and ``2j + 1`` in its high nibble, each
  a signed 4-bit two's-complement value (only ``[-7, 7]`` is produced);
  ``scales`` float32 ``[out, in // group_size]``,
  ``scale = max |W| over the group / 7``, ``q = clip(rint(W / scale), -7, 7)``.
  Per-channel (``group_size`` -1) has scales ``[out, 1]``. ``in`` must be
  even; a layer whose ``in`` is not a multiple of ``group_size`` falls back
  to per-channel scales (the ``QuantizedWeight`` then says ``group_size=-1``).

An all-zero channel (or group) gets scale 1.0 and all-zero codes, so nothing
is ever divided by zero. Rounding is ``rint`` (half to even).

Reference numerics: ``y = x @ dequantize(W)`` in fp32, dequantizing on every
call (the oracle keeps only the quantized form resident; speed is the
native backends' job).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core.quantization.methods import QuantMethod

__all__ = [
    "WINT4",
    "WINT8",
    "dequantize_int4",
    "dequantize_int8",
    "quantize_int4",
    "quantize_int8",
    "wint_linear",
]


def _symmetric(w_t: np.ndarray, qmax: int, amax: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Codes and scales for ``w_t [..., n]`` with one scale per last-axis row;
    ``amax`` (that row shape) replaces the rows' own absolute maxima (a
    row-parallel rank's slice takes its whole column's, ``fd_core.parallel``)."""
    if amax is None:
        amax = np.abs(w_t).max(axis=-1)
    scales = np.where(amax > 0, amax / np.float32(qmax), np.float32(1.0)).astype(np.float32)
    codes = np.clip(np.rint(w_t / scales[..., None]), -qmax, qmax).astype(np.int8)
    return codes, scales


def _check_2d(weight: np.ndarray) -> tuple[int, int]:
    if weight.ndim != 2 or 0 in weight.shape:
        raise ValueError(f"expected a non-empty [in, out] weight, got shape {list(weight.shape)}")
    return int(weight.shape[0]), int(weight.shape[1])


def quantize_int8(weight: np.ndarray, group_size: int = -1,
                  amax: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``weight [in, out]`` float -> (int8 ``[out, in]``, float32 ``[out]``);
    ``amax [out]``, when given, sets the scales (``amax / 127``) instead of ``weight``'s."""
    _check_2d(weight)
    w_t = np.ascontiguousarray(weight.T, dtype=np.float32)  # [out, in]
    return _symmetric(w_t, 127, amax)


def int4_group_size(in_features: int, group_size: int) -> int:
    """The group size wint4 uses for a layer: ``group_size`` when it divides
    ``in_features``, else -1 (per channel)."""
    if group_size == -1 or group_size >= in_features or in_features % group_size:
        return -1
    return group_size


def quantize_int4(weight: np.ndarray, group_size: int = 128,
                  amax: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``weight [in, out]`` float -> (uint8 ``[out, in // 2]``, float32 ``[out, groups]``);
    ``amax [out, groups]``, when given, sets the scales (``amax / 7``)."""
    in_f, out_f = _check_2d(weight)
    if in_f % 2:
        raise ValueError(f"wint4 packs two input channels per byte: in_features must be even, got {in_f}")
    group = int4_group_size(in_f, group_size)
    per_group = in_f if group == -1 else group
    w_t = np.ascontiguousarray(weight.T, dtype=np.float32).reshape(out_f, in_f // per_group, per_group)
    codes, scales = _symmetric(w_t, 7, amax)
    nibbles = codes.reshape(out_f, in_f).astype(np.uint8) & np.uint8(0x0F)  # two's complement
    packed = nibbles[:, 0::2] | (nibbles[:, 1::2] << np.uint8(4))
    return np.ascontiguousarray(packed), scales


def dequantize_int8(qweight: Any, scales: Any) -> Any:
    """int8 ``[out, in]``, ``[out]`` -> float32 ``[in, out]`` (paddle)."""
    return (qweight.astype("float32") * scales.astype("float32").unsqueeze(-1)).t()


def unpack_int4(qweight: Any) -> Any:
    """uint8 ``[out, in // 2]`` -> int32 codes ``[out, in]`` in ``[-8, 7]`` (paddle)."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    packed = qweight.astype("int32")
    out_f = packed.shape[0]
    codes = paddle.stack([packed % 16, packed // 16], axis=-1).reshape([out_f, -1])
    return paddle.where(codes >= 8, codes - 16, codes)


def dequantize_int4(qweight: Any, scales: Any) -> Any:
    """uint8 ``[out, in // 2]``, ``[out, groups]`` -> float32 ``[in, out]`` (paddle)."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    codes = unpack_int4(qweight).astype("float32")  # [out, in]
    per_group = codes.shape[1] // scales.shape[-1]
    expanded = paddle.repeat_interleave(scales.astype("float32"), per_group, axis=1)
    return (codes * expanded).t()


def wint_linear(x: Any, quant: Any) -> Any:
    """Reference ``x [T, in] @ dequantize(W)`` in fp32, in ``x``'s dtype."""
    from fd_core._paddle import import_paddle
    from fd_core.quantization.weights import dequantize

    paddle = import_paddle()
    out = paddle.matmul(x.astype("float32"), dequantize(quant))
    return out if out.dtype == x.dtype else out.astype(x.dtype)


WINT8 = QuantMethod(
    "wint8", "int8 weights with a per-output-channel scale; activations stay float",
    quantize=quantize_int8, linear=wint_linear,
)
WINT4 = QuantMethod(
    "wint4", "int4 weights (two per byte) with group-wise or per-channel scales; activations stay float",
    quantize=quantize_int4, linear=wint_linear, grouped=True,
)
