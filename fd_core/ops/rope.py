"""Rotary position embedding: the cos/sin table and the rotation."""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops._host import as_array, empty_host, on_host

__all__ = ["rope_cos_sin", "reference_rotary_embedding"]

paddle = import_paddle()


def rope_cos_sin(head_dim: int, max_position: int, theta: float) -> Any:
    """``[max_position, head_dim]`` = ``concat(cos, sin)`` of the ``head_dim/2``
    frequencies ``theta ** (-2i / head_dim)`` at each position (fp32, as HF)."""
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)
    freqs = np.arange(max_position, dtype=np.float32)[:, None] * inv_freq[None, :]
    return paddle.to_tensor(np.concatenate([np.cos(freqs), np.sin(freqs)], axis=-1))


def _rotate(x: Any, cos: Any, sin: Any, interleaved: bool) -> Any:
    # x: [T, H, Dh]; cos/sin: [T, 1, Dh/2]
    num_tokens, num_heads, head_dim = x.shape
    if interleaved:
        pairs = x.reshape([num_tokens, num_heads, head_dim // 2, 2])
        x1, x2 = pairs[..., 0], pairs[..., 1]
        out = paddle.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return out.reshape([num_tokens, num_heads, head_dim])
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
    return paddle.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _rotate_host(x: Any, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> Any:
    # _rotate on numpy views: the same products and sums, without paddle's slow CPU broadcasts.
    # The result is written into a tensor paddle allocated: no numpy buffer is handed to paddle
    xa = as_array(x)
    tensor, out = empty_host(xa.shape)
    if interleaved:
        x1, x2 = xa[..., 0::2], xa[..., 1::2]
        lo, hi = out[..., 0::2], out[..., 1::2]
    else:
        half = xa.shape[-1] // 2
        x1, x2 = xa[..., :half], xa[..., half:]
        lo, hi = out[..., :half], out[..., half:]
    np.subtract(x1 * cos, x2 * sin, out=lo)
    np.add(x2 * cos, x1 * sin, out=hi)
    return tensor


def reference_rotary_embedding(
    q: Any, k: Any, positions: Any, cos_sin: Any, interleaved: bool = True
) -> tuple[Any, Any]:
    """Rotate ``q [T, H, Dh]`` and ``k [T, Hkv, Dh]`` at ``positions [T]``."""
    half = cos_sin.shape[-1] // 2
    if on_host(q, k, cos_sin):
        table_np = np.take(as_array(cos_sin), as_array(positions), axis=0)  # [T, Dh]
        cos_np, sin_np = table_np[:, None, :half], table_np[:, None, half:]
        return _rotate_host(q, cos_np, sin_np, interleaved), _rotate_host(k, cos_np, sin_np, interleaved)
    table = paddle.gather(cos_sin, positions)  # [T, Dh]
    cos = table[:, :half].unsqueeze(1)
    sin = table[:, half:].unsqueeze(1)
    return _rotate(q, cos, sin, interleaved), _rotate(k, cos, sin, interleaved)
