"""KV-cache dtypes: storage, bytes per element, quantize on write, dequantize on read.

``--kv-cache-dtype`` picks one of ``KV_DTYPES``:

- ``float32``, ``bfloat16``, ``float16``: the cache is a plain paddle tensor
  ``[S, Hkv, Dh]`` of that dtype; a write rounds to it (to nearest even),
  a read widens to fp32 exactly.
- ``int8``, ``fp8``: the cache is a ``QuantizedKV`` (``fd_core.ops.kv_storage``): 8-bit ``codes
  [S, Hkv, Dh]`` and fp32 ``scales [S, Hkv]``, one scale per cache slot
  (token) and KV head, computed when the token is written (dynamic, no
  calibration): ``scale = absmax(x[s, h, :]) / QMAX`` and
  ``x[s, h, d] ~= codes[s, h, d] * scales[s, h]``. ``int8`` codes are
  ``round(x / scale)`` (half away from zero) in [-127, 127]; ``fp8`` codes
  are OCP float8 e4m3fn (4 exponent bits, bias 7, 3 mantissa bits, no
  infinities, max 448) of ``x / scale`` rounded to nearest even, stored as
  their uint8 bit patterns (paddle has a CPU cast to float8_e4m3fn but no
  CPU gather/scatter for it). A slot never written holds codes 0, scale 0.

Per-token-per-head scales are FastDeploy's ``block_wise_fp8`` layout
(``cache_k_scale [num_blocks, Hkv, block_size]`` beside the cache; ours is
the same numbers ordered ``[num_blocks * block_size, Hkv]`` to match the
reference cache rows). FastDeploy's ``int8`` / ``float8_e4m3fn`` read static
per-channel scales from a calibrated checkpoint; fd-core computes dynamic
per-token scales for those too (no checkpoint carries KV scales here).

Numerics (relative to each (token, head) row's absmax): int8 error <=
0.5/127 (0.39%), fp8 e4m3 error <= 2**-4 of the value (6.25%, 3 mantissa
bits), bf16 <= 2**-8 of the value, fp16 <= 2**-11. On CPU every conversion
is done in numpy on zero-copy views of the cache; on other devices with
paddle ops (``*_tensor`` functions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "KV_DTYPES",
    "bytes_per_token_head",
    "dequantize_tensor",
    "decode_fp8_e4m3",
    "dequantize",
    "encode_fp8_e4m3",
    "is_quantized",
    "quantize",
    "quantize_tensor",
    "storage_dtype",
]

KV_DTYPES = ("float32", "bfloat16", "float16", "int8", "fp8")
_STORAGE = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "int8": "int8", "fp8": "uint8"}
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "fp8": 1}
_QMAX = {"int8": 127.0, "fp8": 448.0}
SCALE_BYTES = 4  # one fp32 scale per (slot, KV head) for int8 / fp8


def _check(kv_dtype: str) -> None:
    if kv_dtype not in _STORAGE:
        raise ValueError(f"KV-cache dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")


def is_quantized(kv_dtype: str) -> bool:
    """True for the 8-bit dtypes that carry scales."""
    _check(kv_dtype)
    return kv_dtype in _QMAX


def storage_dtype(kv_dtype: str) -> str:
    """The paddle dtype of the cache tensor (of the codes when quantized)."""
    _check(kv_dtype)
    return _STORAGE[kv_dtype]


def bytes_per_token_head(kv_dtype: str, head_dim: int) -> int:
    """Bytes one token's K (or V) of one KV head takes, scales included."""
    _check(kv_dtype)
    return _ELEMENT_BYTES[kv_dtype] * head_dim + (SCALE_BYTES if kv_dtype in _QMAX else 0)


# ------------------------------------------------------------- fp8 e4m3fn


def _fp8_table() -> np.ndarray:
    """The fp32 value of each of the 256 e4m3fn codes (NaN at 0x7F, 0xFF)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    normal = (1.0 + man / 8.0) * np.exp2(exp - 7.0)
    subnormal = (man / 8.0) * 2.0**-6
    values = sign * np.where(exp == 0, subnormal, normal)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


_FP8_VALUES = _fp8_table()
_FP8_POSITIVE = _FP8_VALUES[:0x7F]  # codes 0..126: 0 .. 448, increasing


def decode_fp8_e4m3(codes: np.ndarray) -> np.ndarray:
    """uint8 e4m3fn bit patterns -> fp32 (a table lookup)."""
    return _FP8_VALUES[codes]


def encode_fp8_e4m3(x: np.ndarray) -> np.ndarray:
    """fp32 -> uint8 e4m3fn bit patterns, nearest value (ties to the even
    code), saturating at +-448."""
    mag = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(_FP8_POSITIVE, mag, side="left"), 0, 0x7E)
    lo = np.maximum(hi - 1, 0)
    d_hi = _FP8_POSITIVE[hi] - mag
    d_lo = mag - _FP8_POSITIVE[lo]
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0))
    code = np.where(pick_lo, lo, hi).astype(np.uint8)
    return np.where(np.signbit(x) & (code != 0), code | 0x80, code).astype(np.uint8)


# ------------------------------------------------------------------ numpy


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16).view(np.int16)


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def quantize(x: np.ndarray, kv_dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``x [..., Dh]`` fp32 -> ``(stored, scales [...])``: the values as the
    cache holds them (bf16 as its int16 bit patterns) and, for int8 / fp8,
    their per-row scales (None otherwise)."""
    _check(kv_dtype)
    x = np.asarray(x, dtype=np.float32)
    if kv_dtype == "float32":
        return x, None
    if kv_dtype == "float16":
        return x.astype(np.float16), None
    if kv_dtype == "bfloat16":
        return _bf16_bits(x), None
    absmax = np.abs(x).max(axis=-1)
    scales = (absmax / np.float32(_QMAX[kv_dtype])).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))[..., None]
    if kv_dtype == "int8":
        scaled = x / safe
        codes = np.clip(np.sign(scaled) * np.floor(np.abs(scaled) + 0.5), -127, 127).astype(np.int8)
    else:
        codes = encode_fp8_e4m3(x / safe)
    return codes, scales


def dequantize(stored: np.ndarray, scales: np.ndarray | None, kv_dtype: str) -> np.ndarray:
    """The inverse of ``quantize``: fp32 ``[..., Dh]``."""
    _check(kv_dtype)
    if kv_dtype in ("float32", "float16"):
        return stored.astype(np.float32, copy=False)
    if kv_dtype == "bfloat16":
        return _bf16_values(stored)
    assert scales is not None, "8-bit KV values need their scales"
    values = stored.astype(np.float32) if kv_dtype == "int8" else decode_fp8_e4m3(stored)
    return values * scales[..., None]


# ----------------------------------------------------------------- paddle


def quantize_tensor(paddle: Any, x: Any, kv_dtype: str) -> tuple[Any, Any]:
    """``quantize`` in paddle ops, for caches off the host (same rounding)."""
    x = x.astype("float32")
    if not is_quantized(kv_dtype):
        return x.astype(storage_dtype(kv_dtype)), None
    scales = x.abs().max(axis=-1) / _QMAX[kv_dtype]
    safe = paddle.where(scales > 0, scales, paddle.ones_like(scales)).unsqueeze(-1)
    if kv_dtype == "int8":
        scaled = x / safe
        codes = paddle.clip(paddle.sign(scaled) * paddle.floor(scaled.abs() + 0.5), -127, 127).astype("int8")
    else:
        codes = paddle.clip(x / safe, -448.0, 448.0).astype("float8_e4m3fn").view(paddle.uint8)
    return codes, scales


def dequantize_tensor(paddle: Any, stored: Any, scales: Any, kv_dtype: str) -> Any:
    """``dequantize`` in paddle ops."""
    if not is_quantized(kv_dtype):
        return stored.astype("float32")
    values = stored.astype("float32") if kv_dtype == "int8" else stored.view(paddle.float8_e4m3fn).astype("float32")
    return values * scales.unsqueeze(-1)
