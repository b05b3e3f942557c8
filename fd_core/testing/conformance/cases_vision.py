"""The vision tower's attention: vision_attention (ERNIE-4.5-VL's ViT).

Each case is one vision block's call: a fused ``qkv [N, 3*H*Dh]`` in the
compute dtype, the 2D rotary's ``cos, sin [N, Dh/2]`` (fp32) and the frames'
``cu_seqlens``: one image (a single frame, the tower's real rotary angles from
its patch grid), a video's equal frames, ragged frames with an empty one, a
single patch, head sizes that are and are not multiples of 16. The backend's
output is compared with the reference's from the same rounded inputs; a
second case checks that a frame never sees another frame's patches.
"""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.ops.vision_attention import vision_rotary_cos_sin
from fd_core.testing.conformance.harness import Harness, case_rng

# (name, frame lengths, heads, head_dim)
CASES = [
    ("image 16x16", (256,), 16, 80),  # the released tower's heads, one 224x224 image
    ("video 3 frames of 8x8", (64, 64, 64), 4, 64),
    ("ragged frames", (5, 0, 70, 131), 3, 40),
    ("one patch", (1,), 2, 16),
    ("two frames, Dh 72", (37, 37), 2, 72),
    ("tiny head", (100,), 1, 2),
]


def _cos_sin(lengths: tuple[int, ...], head_dim: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin [N, Dh/2]``: the tower's (2D positions of a square grid) when
    there is one frame of a square, merge-able size, else of random angles."""
    n = sum(lengths)
    side = int(round(n**0.5))
    if len(lengths) == 1 and side * side == n and side % 2 == 0 and head_dim % 4 == 0:
        return vision_rotary_cos_sin((1, side, side), 2, head_dim, 10000.0)
    angles = rng.uniform(0.0, 2 * np.pi, (n, head_dim // 2)).astype(np.float32)
    return np.cos(angles), np.sin(angles)


def _inputs(fd: Harness, lengths: tuple[int, ...], heads: int, head_dim: int,
            key: tuple[object, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    rng = case_rng("vision_attention", *key)
    n = sum(lengths)
    qkv = fd.rounded(rng.normal(0.0, 1.0, (n, 3 * heads * head_dim)))
    cos, sin = _cos_sin(lengths, head_dim, rng)
    cu = [0, *np.cumsum(lengths).tolist()]
    return qkv, cos.astype(np.float32), sin.astype(np.float32), [int(c) for c in cu]


def _call(fd: Harness, qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, cu: list[int], heads: int,
          scale: float) -> tuple[object, object]:
    got = fd.call("vision_attention", qkv=fd.device(qkv), cos=fd.device(cos, "float32"),
                  sin=fd.device(sin, "float32"), cu_seqlens=cu, num_heads=heads, scale=scale)
    want = fd.call_reference("vision_attention", qkv=fd.host(qkv), cos=fd.host(cos), sin=fd.host(sin),
                             cu_seqlens=cu, num_heads=heads, scale=scale)
    return got, want


@pytest.mark.parametrize("name,lengths,heads,head_dim", CASES, ids=[c[0] for c in CASES])
def test_vision_attention(conformance: Harness, name: str, lengths: tuple[int, ...], heads: int,
                          head_dim: int) -> None:
    fd = conformance
    qkv, cos, sin, cu = _inputs(fd, lengths, heads, head_dim, (name,))
    got, want = _call(fd, qkv, cos, sin, cu, heads, head_dim**-0.5)
    case = f"qkv[{sum(lengths)}, {3 * heads * head_dim}] frames {list(lengths)} H={heads} Dh={head_dim} " \
           f"dtype={fd.dtype}"
    fd.assert_close("vision_attention", case, got, want, fd.tol())


def test_vision_attention_keeps_frames_apart(conformance: Harness) -> None:
    # the second frame's patches changed: the first frame's outputs must not move
    fd = conformance
    lengths, heads, head_dim = (48, 48), 2, 32
    qkv, cos, sin, cu = _inputs(fd, lengths, heads, head_dim, ("frames apart",))
    changed = qkv.copy()
    changed[48:] = fd.rounded(case_rng("vision_attention", "other frame").normal(0.0, 3.0, changed[48:].shape))
    first, _ = _call(fd, qkv, cos, sin, cu, heads, 1.0)
    second, want = _call(fd, changed, cos, sin, cu, heads, 1.0)
    case = f"frames {list(lengths)} H={heads} Dh={head_dim}, frame 1 changed"
    fd.assert_equal("vision_attention", case + " (frame 0 unchanged)", fd.numpy(first)[:48], fd.numpy(second)[:48])
    fd.assert_close("vision_attention", case, second, want, fd.tol())
