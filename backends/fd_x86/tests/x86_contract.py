"""The fd-core quantization contract in numpy, independent of fd_core.quantization:
quantizers (``weight [in, out]`` -> ``QuantizedWeight``) and the exact
numerics each kernel must reproduce."""

from __future__ import annotations

import numpy as np

from fd_core.ops.linear import QuantizedWeight


def _symmetric(w_t: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    amax = np.abs(w_t).max(axis=-1)
    scales = np.where(amax > 0, amax / np.float32(qmax), np.float32(1)).astype(np.float32)
    return np.clip(np.rint(w_t / scales[..., None]), -qmax, qmax).astype(np.int8), scales


def quantize(method: str, weight: np.ndarray, group_size: int = 128) -> dict:
    """numpy arrays of ``QuantizedWeight`` for ``weight [in, out]``."""
    d_in, d_out = weight.shape
    w_t = np.ascontiguousarray(weight.T, dtype=np.float32)  # [out, in]
    if method in ("wint8", "w8a8"):
        q, s = _symmetric(w_t, 127)
        return dict(method=method, qweight=q, scales=s, in_features=d_in, out_features=d_out, group_size=-1)
    group = group_size if group_size > 0 and d_in % group_size == 0 else d_in
    q, s = _symmetric(w_t.reshape(d_out, d_in // group, group), 7)
    nib = q.reshape(d_out, d_in).astype(np.uint8) & np.uint8(0xF)
    packed = np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4)))
    return dict(method=method, qweight=packed, scales=s, in_features=d_in, out_features=d_out,
                group_size=group if group != d_in else -1)


def to_paddle(q: dict) -> QuantizedWeight:
    import paddle

    return QuantizedWeight(**{k: paddle.to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in q.items()})


def dequantize(q: dict) -> np.ndarray:
    """float32 ``W [in, out]``."""
    if q["method"] in ("wint8", "w8a8"):
        return (q["qweight"].astype(np.float32) * q["scales"][:, None]).T
    packed = q["qweight"].astype(np.int32)
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    codes = np.where(codes >= 8, codes - 16, codes).astype(np.float32)
    per_group = codes.shape[1] // q["scales"].shape[1]
    return (codes * np.repeat(q["scales"], per_group, axis=1)).T


def linear(x: np.ndarray, q: dict) -> np.ndarray:
    """What the kernel for ``q["method"]`` must compute for ``x [M, in]`` fp32."""
    if q["method"] != "w8a8":
        return x.astype(np.float64) @ dequantize(q).astype(np.float64)
    amax = np.abs(x).max(axis=1)
    s_t = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    xq = np.clip(np.rint(x / s_t[:, None]), -127, 127).astype(np.int64)
    acc = (xq @ q["qweight"].astype(np.int64).T).astype(np.float32)  # int32 in the kernel
    return acc * s_t[:, None] * q["scales"][None, :]
