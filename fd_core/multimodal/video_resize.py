"""Antialiased bicubic resize of uint8 frames, integer for integer what torchvision does on CPU.

HF's ERNIE-4.5-VL video processor resizes frames with ``torchvision.transforms.v2.functional.resize``
(bicubic, ``antialias=True``) on uint8 tensors, which on CPU runs PyTorch's native uint8 path
(``_upsample_bicubic2d_aa``): PIL's separable convolution (Keys cubic, a = -0.5, support scaled by
the downscale factor), weights computed in float64, normalized, then rounded to int16 with the most
fractional bits that keep the largest weight below 2^15; each pass sums ``pixel * weight`` in
integers from ``1 << (bits - 1)``, shifts right by ``bits`` (floor) and clamps to 0..255. Horizontal pass
first, then vertical; a pass whose size does not change is skipped. PIL's own resize differs (22
fixed bits), by one level in a few pixels, so it cannot stand in. Called by ``video_processor``
in the API process: numpy only, no torch.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["resize_bicubic_aa"]


def _cubic(x: float) -> float:
    """Keys' cubic convolution kernel with a = -0.5 (PyTorch's ``aa_filter`` for bicubic)."""
    a = -0.5
    x = abs(x)
    if x < 1.0:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2.0:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


def _weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``(index [out, K] int64, weight [out, K] int64, bits)`` for one axis; unused taps weigh 0."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    taps = int(math.ceil(support)) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    wf = np.zeros((out_size, taps), dtype=np.float64)
    index = np.zeros((out_size, taps), dtype=np.int64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        xmin = max(int(center - support + 0.5), 0)
        xsize = min(max(min(int(center + support + 0.5), in_size) - xmin, 0), taps)
        row = [_cubic((j + xmin - center + 0.5) * invscale) for j in range(xsize)]
        total = 0.0
        for w in row:
            total += w
        if total != 0.0:
            row = [w / total for w in row]
        wf[i, :xsize] = row
        index[i, :xsize] = np.arange(xmin, xmin + xsize)
    wt_max = float(wf.max()) if wf.size else 0.0
    bits = 0
    while bits < 22 and int(0.5 + wt_max * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    scaled = wf * (1 << bits)
    weight = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)
    return index, weight, bits


def _pass(x: np.ndarray, axis: int, out_size: int) -> np.ndarray:
    """Resample ``x`` (uint8) along ``axis`` to ``out_size`` with the integer weights (int32 is exact:
    the weights' magnitudes sum to below 2^14 * taps, times 255)."""
    index, weight, bits = _weights(x.shape[axis], out_size)
    src = x.astype(np.int32)
    shape = [1] * x.ndim
    shape[axis] = out_size
    out_shape = list(x.shape)
    out_shape[axis] = out_size
    acc = np.full(out_shape, (1 << (bits - 1)) if bits else 0, dtype=np.int32)
    for k in range(index.shape[1]):
        acc += np.take(src, index[:, k], axis=axis) * weight[:, k].astype(np.int32).reshape(shape)
    return np.clip(acc >> bits, 0, 255).astype(np.uint8)


def resize_bicubic_aa(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """``frames [..., H, W, C]`` uint8 -> ``[..., height, width, C]`` uint8 (torchvision's CPU result)."""
    if frames.dtype != np.uint8:
        raise TypeError(f"resize_bicubic_aa takes uint8 frames, got {frames.dtype}")
    out = frames
    if width != frames.shape[-2]:
        out = _pass(out, out.ndim - 2, width)
    if height != frames.shape[-3]:
        out = _pass(out, out.ndim - 3, height)
    return out
