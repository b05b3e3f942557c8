"""Vision-tower attention: bidirectional, within each frame, after a 2D rotary.

The reference of ``fd_vision_attention`` (``fd_core.plugins.hookspecs``): a ViT
layer's fused projection ``qkv [N, 3*H*Dh]`` (each row ``[q | k | v]``, each of
``H`` heads of ``Dh``) is split, q and k are rotated as halves by the per-patch
angles (``cos, sin [N, Dh/2]``: ``[x1*cos - x2*sin, x2*cos + x1*sin]`` for
``x = [x1 | x2]``), and every patch attends to every patch of its own frame
(``cu_seqlens``: the frames' row offsets, ``0 .. N``), ``softmax(q k^T * scale) v``.
Returns ``[N, H*Dh]``, the heads side by side (the layer's output projection
takes it as is). ``vision_rotary_cos_sin`` makes the tower's angles from a patch grid.

The numerics are ERNIE-4.5-VL's vision tower's as HF computes them in fp32
(rotation elementwise, one matmul per frame, scale after the matmul,
softmax): the exactness tests against HF run through this function. Frames of
equal length (an image is one frame; a video's frames share a grid) go through
one batched matmul instead of a loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle

__all__ = ["check_cu_seqlens", "reference_vision_attention", "vision_rotary_cos_sin", "vision_rotary_positions"]

paddle = import_paddle()
F = paddle.nn.functional

_MAX_SCORES = 1 << 26  # fp32 scores held at once by the reference (256 MiB)


def check_cu_seqlens(cu_seqlens: Sequence[int], rows: int) -> list[int]:
    """``cu_seqlens`` as a list of ints: starts at 0, never decreases, ends at ``rows``."""
    cu = [int(c) for c in cu_seqlens]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != rows or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens {cu} must rise from 0 to the {rows} rows of qkv")
    return cu


def vision_rotary_positions(grid_thw: tuple[int, int, int], merge: int) -> np.ndarray:
    """``[t*h*w, 2]`` (row, column) of each patch, in the merge-block order the
    processor lays patches out in (every ``merge x merge`` block contiguous)."""
    t, h, w = grid_thw
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    blocked = [a.reshape(shape).transpose(0, 2, 1, 3).reshape(-1) for a in (rows, cols)]
    return np.tile(np.stack(blocked, axis=-1), (t, 1))


def vision_rotary_cos_sin(grid_thw: tuple[int, int, int], merge: int, head_dim: int,
                          theta: float) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin [t*h*w, Dh/2]`` fp32 of the 2D axial rotary: the first half of
    the angles turns by the patch's row, the second by its column, each at the
    frequencies ``theta^(-2i / (Dh/2))``."""
    quarter = head_dim // 2
    exponent = np.arange(0, quarter, 2, dtype=np.int64).astype(np.float32) / np.float32(quarter)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)
    pos = vision_rotary_positions(grid_thw, merge).astype(np.float32)
    angles = (pos[:, :, None] * inv_freq[None, None, :]).reshape(pos.shape[0], -1)  # [N, Dh/2] = [rows | cols]
    return np.cos(angles), np.sin(angles)


def rotate_halves(x: Any, cos: Any, sin: Any) -> Any:
    """``x [..., Dh]`` rotated as halves by ``cos, sin`` (``[..., Dh/2]``, broadcast)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return paddle.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _attend(q: Any, k: Any, v: Any, scale: float) -> Any:
    """``softmax(q k^T * scale) v`` over ``[B, L, Dh]`` batches, at most ``_MAX_SCORES``
    scores at a time (a 3584x3584 image's 16 heads would need 17 GB at once)."""
    batch, length = q.shape[0], q.shape[1]
    step = max(1, _MAX_SCORES // max(1, length * length))
    outs = []
    for b in range(0, batch, step):
        qb, kb, vb = (t[b : b + step] if step < batch else t for t in (q, k, v))
        probs = F.softmax(paddle.matmul(qb, kb, transpose_y=True) * scale, axis=-1)
        outs.append(paddle.matmul(probs, vb))
    return paddle.concat(outs, axis=0) if len(outs) > 1 else outs[0]


def reference_vision_attention(
    qkv: Any, cos: Any, sin: Any, cu_seqlens: Sequence[int], num_heads: int, scale: float
) -> Any:
    """``qkv [N, 3*H*Dh]`` -> ``[N, H*Dh]`` (in qkv's dtype, computed in fp32); see the module docstring."""
    if qkv.dtype != paddle.float32:  # a 16-bit tower: the reference computes in fp32
        out = reference_vision_attention(qkv.astype("float32"), cos, sin, cu_seqlens, num_heads, scale)
        return out.astype(qkv.dtype)
    n, width = qkv.shape
    if width % (3 * num_heads) or (width // (3 * num_heads)) % 2:
        raise ValueError(f"qkv's width {width} is not 3 x {num_heads} heads x an even head size")
    head_dim = width // (3 * num_heads)
    cu = check_cu_seqlens(cu_seqlens, n)
    if n == 0:
        return paddle.zeros([0, num_heads * head_dim], dtype=qkv.dtype)
    qkv = qkv.reshape([n, 3, num_heads, head_dim])
    qk = rotate_halves(qkv[:, :2], cos.reshape([n, 1, 1, -1]), sin.reshape([n, 1, 1, -1]))  # q and k in one pass
    q, k, v = qk[:, 0], qk[:, 1], qkv[:, 2]  # [N, H, Dh]
    lengths = [b - a for a, b in zip(cu, cu[1:]) if b > a]
    if len(set(lengths)) == 1:  # every frame as long: one batched matmul over [F, H, L, Dh]
        frames, length = len(lengths), lengths[0]
        qs, ks, vs = (t.reshape([frames, length, num_heads, head_dim]).transpose([0, 2, 1, 3])
                      .reshape([frames * num_heads, length, head_dim]) for t in (q, k, v))
        out = _attend(qs, ks, vs, scale).reshape([frames, num_heads, length, head_dim]).transpose([0, 2, 1, 3])
        return out.reshape([n, num_heads * head_dim])  # out: [F, L, H, Dh]
    outs = []
    for start, end in zip(cu, cu[1:]):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose([1, 0, 2]) for t in (q, k, v))  # [H, L, Dh]
        outs.append(_attend(qs, ks, vs, scale).transpose([1, 0, 2]))  # [L, H, Dh]
    out = paddle.concat(outs, axis=0) if len(outs) > 1 else outs[0]
    return out.reshape([n, num_heads * head_dim])
