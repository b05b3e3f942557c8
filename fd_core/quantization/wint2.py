"""``wint2``: FastDeploy's 2-bit MoE expert weights, decoded as its kernels do.

FastDeploy reads them only from offline-quantized checkpoints (ERNIE 4.5
300B-A47B "2Bits"; ``WINT2Config``: dense layers wint8, the first MoE layers'
experts wint4, the rest "w2"); it never quantizes a float model to them, nor
does fd-core. Each expert projection is stored as five tensors (names as
FastDeploy's ``weight_key_map`` reads them, ``{p}`` =
``ernie.layers.N.mlp.experts.E.up_gate_proj`` or ``.down_proj``):

- ``{p}.quant_weight`` uint8 ``[in / 4, out]``: one byte codes four inputs
  ``4r .. 4r + 3`` of an output channel;
- ``{p}.weight_scale`` uint8 ``[in / 128, out]``: two unsigned 4-bit group
  scales per byte, one per 64 inputs: the high nibble for the even group
  (``64 * 2h``), the low nibble for the odd one;
- ``{p}.super_scales`` ``[out]``, ``{p}.code_scale`` float32 ``[out]``,
  ``{p}.code_zp`` float32 ``[out]``: per output channel.

Decoding input ``k = 4r + j`` of channel ``n`` (``moe_wint2_ffn_kernel``):

    c        = floor(quant_weight[r, n] * code_scale[n] + code_zp[n] + 0.5)   (int16)
    q        = ((c >> (9 - 3j)) & 0x3F) - 32                                  (in [-32, 31])
    group    = weight_scale[k // 128, n] >> (4 if (k // 64) % 2 == 0 else 0) & 0xF
    W[k, n]  = q * group * super_scales[n]

so the four weights of a byte are overlapping 6-bit windows of one 15-bit
code (8 bits per 4 weights: 2 bits each).

fd-core's layout (``QuantizedWeight``, method ``"wint2"``): ``qweight`` is
``quant_weight`` as stored (uint8 ``[in / 4, out]``, not a row per channel);
``scales`` float32 ``[in / 64 + 3, out]``: the group scales unpacked (row
``g`` = inputs ``64g .. 64g + 63``), then ``super_scales``, ``code_scale``,
``code_zp`` (``pack_scales``). Reference numerics: ``x @ dequantize(W)`` in
fp32. ``encode_wint2`` (a nearest-code search) exists to generate test
checkpoints in this layout; it is not a quantizer of record.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GROUP", "decode_wint2", "dequantize_wint2", "encode_wint2", "pack_scales", "wint2_linear"]

GROUP = 64  # inputs per 4-bit group scale (the Triton kernel's BLOCK_SIZE_K)
_SHIFTS = (9, 6, 3, 0)  # input 4r + j <- bits (9 - 3j) .. (14 - 3j) of the code
_ZERO = 32


def _check(quant_weight: np.ndarray, weight_scale: np.ndarray, *channel: np.ndarray) -> tuple[int, int]:
    rows, out_f = quant_weight.shape
    in_f = 4 * rows
    if in_f % 128 or weight_scale.shape != (in_f // 128, out_f) or any(c.shape != (out_f,) for c in channel):
        raise ValueError(
            f"wint2 tensors: quant_weight [in/4, out] with in a multiple of 128, weight_scale [in/128, out], "
            f"super_scales / code_scale / code_zp [out]; got {list(quant_weight.shape)}, "
            f"{list(weight_scale.shape)}, {[list(c.shape) for c in channel]}")
    return in_f, out_f


def decode_wint2(quant_weight: np.ndarray, weight_scale: np.ndarray, super_scales: np.ndarray,
                 code_scale: np.ndarray, code_zp: np.ndarray) -> np.ndarray:
    """FastDeploy's five tensors (numpy) -> float32 ``[in, out]``."""
    in_f, out_f = _check(quant_weight, weight_scale, super_scales, code_scale, code_zp)
    codes = np.floor(quant_weight.astype(np.float32) * code_scale.astype(np.float32)
                     + code_zp.astype(np.float32) + np.float32(0.5)).astype(np.int32)  # [in/4, out]
    q = np.stack([((codes >> s) & 0x3F) - _ZERO for s in _SHIFTS], axis=1).reshape(in_f, out_f)
    return (q.astype(np.float32) * _group_scales(weight_scale, super_scales)).astype(np.float32)


def _group_scales(weight_scale: np.ndarray, super_scales: np.ndarray) -> np.ndarray:
    """``[in/128, out]`` packed nibbles -> float32 ``[in, out]`` scales."""
    nibbles = np.stack([weight_scale >> 4, weight_scale & 0xF], axis=1).reshape(-1, weight_scale.shape[1])
    per_input = np.repeat(nibbles.astype(np.float32), GROUP, axis=0)  # [in, out]
    return per_input * super_scales.astype(np.float32)[None, :]


def pack_scales(weight_scale: np.ndarray, super_scales: np.ndarray, code_scale: np.ndarray,
                code_zp: np.ndarray) -> np.ndarray:
    """FastDeploy's scale tensors -> fd-core's float32 ``[in / 64 + 3, out]``."""
    nibbles = np.stack([weight_scale >> 4, weight_scale & 0xF], axis=1).reshape(-1, weight_scale.shape[1])
    return np.concatenate([nibbles.astype(np.float32), np.stack([super_scales, code_scale, code_zp])
                           .astype(np.float32)]).astype(np.float32)


def dequantize_wint2(qweight: Any, scales: Any) -> Any:
    """fd-core's wint2 layout (paddle) -> float32 ``[in, out]`` (paddle)."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    rows, out_f = (int(s) for s in qweight.shape)
    codes = paddle.floor(qweight.astype("float32") * scales[-2] + scales[-1] + 0.5).astype("int32")
    # arithmetic shift and mask as floor division and floor modulo (the same on negative codes)
    q = paddle.stack([paddle.remainder(paddle.floor_divide(codes, paddle.full_like(codes, 1 << s)),
                                       paddle.full_like(codes, 64)) - _ZERO for s in _SHIFTS],
                     axis=1).reshape([4 * rows, out_f])
    group = paddle.repeat_interleave(scales[:-3], GROUP, axis=0) * scales[-3].unsqueeze(0)  # [in, out]
    return q.astype("float32") * group


def wint2_linear(x: Any, quant: Any) -> Any:
    """Reference ``x [T, in] @ dequantize(W)`` in fp32, in ``x``'s dtype."""
    from fd_core._paddle import import_paddle

    paddle = import_paddle()
    out = paddle.matmul(x.astype("float32"), dequantize_wint2(quant.qweight, quant.scales))
    return out if out.dtype == x.dtype else out.astype(x.dtype)


def encode_wint2(weight: np.ndarray, code_scale: float = 100.3) -> tuple[np.ndarray, ...]:
    """float ``[in, out]`` -> FastDeploy's five tensors, for generated test
    checkpoints: per channel ``code_scale`` fixed and ``code_zp`` 0 (so the
    256 byte values give 256 fixed 4-vectors of window codes), per group of 64
    the scale nibble ``ceil(15 * amax_group / amax_channel)``, per 4 inputs
    the byte whose decoded 4-vector is nearest. ``in`` must be a multiple of 128."""
    weight = np.asarray(weight, dtype=np.float32)
    in_f, out_f = weight.shape
    if in_f % 128:
        raise ValueError(f"wint2: in_features must be a multiple of 128, got {in_f}")
    byte = np.arange(256, dtype=np.float32)
    codes = np.floor(byte * np.float32(code_scale) + np.float32(0.5)).astype(np.int32)
    table = np.stack([((codes >> s) & 0x3F) - _ZERO for s in _SHIFTS], axis=1).astype(np.float32)  # [256, 4]
    amax_channel = np.maximum(np.abs(weight).max(axis=0), 1e-8)  # [out]
    super_scales = (amax_channel / (15 * 31)).astype(np.float32)
    groups = np.abs(weight).reshape(in_f // GROUP, GROUP, out_f).max(axis=1)  # [in/64, out]
    nibbles = np.clip(np.ceil(15 * groups / amax_channel), 1, 15).astype(np.uint8)
    weight_scale = ((nibbles[0::2] << 4) | nibbles[1::2]).astype(np.uint8)
    scaled = weight / _group_scales(weight_scale, super_scales)  # in window units
    quads = scaled.reshape(in_f // 4, 4, out_f).transpose(0, 2, 1)  # [in/4, out, 4]
    best = np.empty((in_f // 4, out_f), dtype=np.uint8)
    for r in range(in_f // 4):  # nearest of the 256 decodable 4-vectors
        dist = ((quads[r][:, None, :] - table[None, :, :]) ** 2).sum(-1)  # [out, 256]
        best[r] = dist.argmin(axis=1)
    full = np.full(out_f, code_scale, dtype=np.float32)
    return best, weight_scale, super_scales, full, np.zeros(out_f, dtype=np.float32)
