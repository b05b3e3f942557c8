"""The quantization contract written out in plain numpy, element by element
where the layout is concerned, independent of fd_core's implementation."""

from __future__ import annotations

import numpy as np


def scales_of(w_t: np.ndarray, qmax: int) -> np.ndarray:
    amax = np.abs(w_t).max(axis=-1)
    return np.where(amax > 0, amax / np.float32(qmax), np.float32(1)).astype(np.float32)


def dequant_int8(qweight: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """int8 [out, in], [out] -> float64 [in, out]."""
    return (qweight.astype(np.float64) * scales.astype(np.float64)[:, None]).T


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """uint8 [out, in // 2] -> int codes [out, in], one nibble at a time."""
    out_f, half = packed.shape
    codes = np.zeros((out_f, 2 * half), dtype=np.int64)
    for o in range(out_f):
        for j in range(half):
            byte = int(packed[o, j])
            for k, nibble in enumerate((byte & 0xF, byte >> 4)):
                codes[o, 2 * j + k] = nibble - 16 if nibble >= 8 else nibble
    return codes


def dequant_int4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """uint8 [out, in // 2], [out, groups] -> float64 [in, out]."""
    codes = unpack_int4(packed).astype(np.float64)
    group = codes.shape[1] // scales.shape[1]
    return (codes * np.repeat(scales.astype(np.float64), group, axis=1)).T


def w8a8_linear(x: np.ndarray, qweight: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Per-token dynamic int8 activations, exact integer sums, float64."""
    x = x.astype(np.float32)
    s = scales_of(x, 127)
    xq = np.clip(np.rint(x / s[:, None]), -127, 127).astype(np.int64)
    acc = xq @ qweight.astype(np.int64).T
    return acc * s.astype(np.float64)[:, None] * scales.astype(np.float64)[None, :]


def int4_groups_product(xq: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``sum_g scales[:, g] * (xq_g . codes_g)`` for quantized activations ``xq [T, in]`` and
    packed int4 weights with group scales ``[out, groups]`` (the w4a8 / w4afp8 inner sums,
    exact per group in float64 / int64), before the token scale."""
    codes = unpack_int4(packed)  # [out, in]
    if np.issubdtype(xq.dtype, np.floating):
        codes = codes.astype(np.float64)
    groups = scales.shape[1]
    per = codes.shape[1] // groups
    y = np.zeros((xq.shape[0], codes.shape[0]))
    for g in range(groups):
        cols = slice(g * per, (g + 1) * per)
        y += (xq[:, cols] @ codes[:, cols].T) * scales[:, g].astype(np.float64)[None, :]
    return y
