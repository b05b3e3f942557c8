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

- ``int8_static``: FastDeploy's C8 (``kv_cache_quant_type: int8`` with the
  checkpoint's static per-channel scales, ``StaticKVScales``). The pool is
  an int8 ``QuantizedKV`` like ``int8``'s, but a write stores
  ``clip(rint(x), -127, 127)`` (ties to even, FastDeploy's
  ``roundWithTiesToEven``) with the slot's scale fixed at 1: the caller has
  already multiplied ``x`` by ``127 / S`` per channel (``static_quantize_input``).
  Attention reads it as int8 codes (times 1); the caller folds ``S / 127``
  into q and the output (``static_scale_queries`` / ``static_scale_output``):
  ``q . (c S / 127) == (q S / 127) . c`` and ``sum p c S / 127 == S / 127 *
  sum p c``, so only the fp32 rounding order differs from dequantizing the
  codes. Every int8 kernel reads the pool unchanged; only the write differs.

Per-token-per-head scales are FastDeploy's ``block_wise_fp8`` layout
(``cache_k_scale [num_blocks, Hkv, block_size]`` beside the cache; ours is
the same numbers ordered ``[num_blocks * block_size, Hkv]`` to match the
reference cache rows). FastDeploy's ``int8`` reads static per-channel scales
from a calibrated checkpoint: that is ``int8_static``; fd-core's ``int8``
and ``fp8`` compute dynamic per-token scales (FastDeploy's
``float8_e4m3fn`` static scales are loaded but not applied).

Numerics (relative to each (token, head) row's absmax): int8 error <=
0.5/127 (0.39%), fp8 e4m3 error <= 2**-4 of the value (6.25%, 3 mantissa
bits), bf16 <= 2**-8 of the value, fp16 <= 2**-11. On CPU every conversion
is done in numpy on zero-copy views of the cache; on other devices with
paddle ops (``*_tensor`` functions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "KV_DTYPES",
    "STATIC_KV_DTYPES",
    "StaticKVScales",
    "bytes_per_token_head",
    "dequantize_tensor",
    "decode_fp8_e4m3",
    "dequantize",
    "encode_fp8_e4m3",
    "is_quantized",
    "quantize",
    "quantize_tensor",
    "static_quantize_input",
    "static_scale_output",
    "static_scale_queries",
    "storage_dtype",
]

KV_DTYPES = ("float32", "bfloat16", "float16", "int8", "fp8", "int8_static")
STATIC_KV_DTYPES = ("int8_static",)  # written pre-scaled by the layer's StaticKVScales
_STORAGE = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "int8": "int8", "fp8": "uint8",
            "int8_static": "int8"}
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "fp8": 1, "int8_static": 1}
_QMAX = {"int8": 127.0, "fp8": 448.0, "int8_static": 127.0}
SCALE_BYTES = 4  # one fp32 scale per (slot, KV head) for int8 / fp8 (fixed 1 for int8_static)


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
    if kv_dtype == "int8_static":  # x is already x * 127 / S: round half to even, saturate
        return np.clip(np.rint(x), -127, 127).astype(np.int8), np.ones(x.shape[:-1], dtype=np.float32)
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
    values = decode_fp8_e4m3(stored) if kv_dtype == "fp8" else stored.astype(np.float32)
    return values * scales[..., None]


# ----------------------------------------------------------------- paddle


def quantize_tensor(paddle: Any, x: Any, kv_dtype: str) -> tuple[Any, Any]:
    """``quantize`` in paddle ops, for caches off the host (same rounding)."""
    x = x.astype("float32")
    if not is_quantized(kv_dtype):
        return x.astype(storage_dtype(kv_dtype)), None
    if kv_dtype == "int8_static":
        return paddle.clip(_rint_tensor(paddle, x), -127, 127).astype("int8"), paddle.ones(x.shape[:-1], "float32")
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
    values = stored.view(paddle.float8_e4m3fn).astype("float32") if kv_dtype == "fp8" else stored.astype("float32")
    return values * scales.unsqueeze(-1)


def _rint_tensor(paddle: Any, x: Any) -> Any:
    """Round half to even in paddle ops, spelled out rather than left to ``paddle.round``'s
    tie rule (half to even on paddle 3.3.1's CPU kernel; not a documented guarantee)."""
    low = paddle.floor(x)
    frac = x - low
    odd = paddle.remainder(low, paddle.full_like(low, 2.0))  # 0 or 1: the sign follows the divisor
    return paddle.where(frac > 0.5, low + 1, paddle.where(frac < 0.5, low, low + odd))


# ------------------------------------------------------ static per-channel


@dataclass(eq=False)
class StaticKVScales:
    """One layer's static per-channel KV scales: FastDeploy's
    ``cachek_matmul`` / ``cachev_matmul.activation_scale`` (``S``, the
    calibrated max |k| / |v| per channel, ``[Hkv * Dh]``). A write stores
    ``clip(rint(x * (127 / S)), -127, 127)``; a read is ``code * (S / 127)``.
    ``127 / S`` and ``S / 127`` are fp32 (FastDeploy computes them in the
    model's dtype, and ``scale * x`` in it; fd-core's activations are fp32).
    The model builds one per layer when it loads them; ``fd_core.ops.decoder.
    self_attention`` applies them around an ``int8_static`` pool."""

    k: Any  # [Hkv * Dh] paddle float: S_k
    v: Any  # [Hkv * Dh] paddle float: S_v
    layer: int | None = None  # the decoder layer, for messages
    _factors: dict[str, Any] = field(default_factory=dict, repr=False)

    def factors(self, num_kv_heads: int) -> dict[str, Any]:
        """``k_quant, v_quant`` (127 / S) and ``k_dequant, v_dequant`` (S / 127),
        fp32 ``[Hkv, Dh]``, computed once. Raises naming the layer when a
        scale is not positive (a broken checkpoint)."""
        if not self._factors:
            factors = {}
            for name, s in (("k", self.k), ("v", self.v)):
                s = s.astype("float32").reshape([num_kv_heads, -1])
                if not bool((s > 0).all()):
                    where = "" if self.layer is None else f"layer {self.layer}'s "
                    raise ValueError(f"static KV-cache scales: {where}cache{name}_matmul.activation_scale has a "
                                     f"value that is not > 0 (min {float(s.min()):g}); expected each channel's "
                                     "calibrated max |x|, positive")
                factors[name + "_quant"] = 127.0 / s
                factors[name + "_dequant"] = s / 127.0
            self._factors.update(factors)
        return self._factors


def static_quantize_input(k: Any, v: Any, scales: StaticKVScales) -> tuple[Any, Any]:
    """``k, v [T, Hkv, Dh]`` fp32 times ``127 / S`` per channel: what an
    ``int8_static`` write rounds to codes."""
    f = scales.factors(k.shape[1])
    return k.astype("float32") * f["k_quant"], v.astype("float32") * f["v_quant"]


def static_scale_queries(q: Any, scales: StaticKVScales, num_kv_heads: int) -> Any:
    """``q [T, H, Dh]`` times ``S_k / 127`` of its KV head's channels (GQA:
    head ``h`` reads KV head ``h // (H / Hkv)``), fp32."""
    f = scales.factors(num_kv_heads)["k_dequant"]  # [Hkv, Dh]
    t, h, d = q.shape
    return (q.astype("float32").reshape([t, num_kv_heads, h // num_kv_heads, d]) * f.unsqueeze(1)).reshape([t, h, d])


def static_scale_output(out: Any, scales: StaticKVScales, num_kv_heads: int) -> Any:
    """Attention's output ``[T, H, Dh]`` over the codes times ``S_v / 127``
    per channel of each head's KV head, in ``out``'s dtype."""
    f = scales.factors(num_kv_heads)["v_dequant"]
    t, h, d = out.shape
    scaled = out.astype("float32").reshape([t, num_kv_heads, h // num_kv_heads, d]) * f.unsqueeze(1)
    return scaled.reshape([t, h, d]).astype(out.dtype)
