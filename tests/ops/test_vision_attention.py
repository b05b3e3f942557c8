"""fd_vision_attention's reference (fd_core.ops.vision_attention) against a numpy
oracle written from the hookspec, and the CPU backend's Ops reaching it."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core.backends import get_backend
from fd_core.ops.vision_attention import (
    check_cu_seqlens,
    reference_vision_attention,
    vision_rotary_cos_sin,
    vision_rotary_positions,
)

paddle = pytest.importorskip("paddle")


def _oracle(qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, cu: list[int], heads: int,
            scale: float) -> np.ndarray:
    """The hookspec in float64: rotate q, k as halves, softmax(q k^T * scale) v per frame."""
    n = qkv.shape[0]
    dh = qkv.shape[1] // (3 * heads)
    x = qkv.astype(np.float64).reshape(n, 3, heads, dh)
    c, s = cos.astype(np.float64)[:, None, :], sin.astype(np.float64)[:, None, :]

    def rot(t: np.ndarray) -> np.ndarray:
        t1, t2 = t[..., : dh // 2], t[..., dh // 2:]
        return np.concatenate([t1 * c - t2 * s, t2 * c + t1 * s], axis=-1)

    q, k, v = rot(x[:, 0]), rot(x[:, 1]), x[:, 2]
    out = np.zeros((n, heads, dh))
    for a, b in zip(cu, cu[1:]):
        for h in range(heads if b > a else 0):
            scores = q[a:b, h] @ k[a:b, h].T * scale
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[a:b, h] = (p / p.sum(axis=-1, keepdims=True)) @ v[a:b, h]
    return out.reshape(n, heads * dh)


def _inputs(lengths: list[int], heads: int, dh: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    angles = rng.uniform(0, 2 * np.pi, (n, dh // 2)).astype(np.float32)
    qkv = rng.normal(0, 1, (n, 3 * heads * dh)).astype(np.float32)
    return qkv, np.cos(angles), np.sin(angles)


@pytest.mark.parametrize("lengths,heads,dh", [([16], 2, 8), ([9, 9, 9], 3, 16), ([4, 0, 11, 30], 2, 6), ([1], 1, 2)])
def test_reference_matches_the_hookspec(lengths: list[int], heads: int, dh: int) -> None:
    qkv, cos, sin = _inputs(lengths, heads, dh)
    cu = [0, *np.cumsum(lengths).tolist()]
    got = reference_vision_attention(paddle.to_tensor(qkv), paddle.to_tensor(cos), paddle.to_tensor(sin), cu,
                                     heads, dh**-0.5)
    assert got.shape == [sum(lengths), heads * dh]
    np.testing.assert_allclose(got.numpy(), _oracle(qkv, cos, sin, cu, heads, dh**-0.5), rtol=1e-5, atol=1e-5)


def test_equal_frames_batched_equal_the_frame_by_frame_loop() -> None:
    # three equal frames take one batched matmul; with a fourth, shorter frame the per-frame loop
    qkv, cos, sin = _inputs([12, 12, 12, 5], 2, 16, seed=3)
    args = (paddle.to_tensor(qkv), paddle.to_tensor(cos), paddle.to_tensor(sin))
    batched = reference_vision_attention(args[0][:36], args[1][:36], args[2][:36], [0, 12, 24, 36], 2, 0.25)
    looped = reference_vision_attention(*args, [0, 12, 24, 36, 41], 2, 0.25)
    np.testing.assert_allclose(batched.numpy(), looped.numpy()[:36], rtol=1e-6, atol=1e-6)


def test_16_bit_qkv_is_computed_in_fp32_and_returned_in_its_dtype() -> None:
    qkv, cos, sin = _inputs([10], 2, 8, seed=4)
    half = paddle.to_tensor(qkv).astype("bfloat16")
    got = reference_vision_attention(half, paddle.to_tensor(cos), paddle.to_tensor(sin), [0, 10], 2, 0.5)
    assert got.dtype == paddle.bfloat16
    rounded = half.astype("float32").numpy()
    np.testing.assert_allclose(got.astype("float32").numpy(), _oracle(rounded, cos, sin, [0, 10], 2, 0.5),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("cu", [[0, 5], [1, 10], [0, 6, 4, 10], [0]])
def test_bad_cu_seqlens_name_the_value(cu: list[int]) -> None:
    with pytest.raises(ValueError, match=r"cu_seqlens .* must rise from 0 to the 10 rows"):
        check_cu_seqlens(cu, 10)


def test_ops_vision_attention_reaches_the_reference_on_cpu() -> None:
    ops = get_backend("cpu").ops
    assert ops.implementers("vision_attention") == ["fd_core.backends.cpu"]
    qkv, cos, sin = _inputs([7, 5], 1, 4, seed=5)
    got = ops.vision_attention(paddle.to_tensor(qkv), paddle.to_tensor(cos), paddle.to_tensor(sin), [0, 7, 12], 1,
                               0.5)
    np.testing.assert_allclose(got.numpy(), _oracle(qkv, cos, sin, [0, 7, 12], 1, 0.5), rtol=1e-5, atol=1e-5)


def test_rotary_angles_follow_rows_then_columns_in_merge_block_order() -> None:
    pos = vision_rotary_positions((1, 2, 4), 2)  # merge blocks of 2x2: (0,0) (0,1) (1,0) (1,1), then columns 2-3
    assert pos[:4].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]] and pos[4:].tolist() == [[0, 2], [0, 3], [1, 2], [1, 3]]
    cos, sin = vision_rotary_cos_sin((2, 2, 4), 2, 8, 10000.0)  # Dh 8: 2 frequencies per axis, 1 and 1/100
    assert cos.shape == (16, 4) and cos.dtype == np.float32
    pos = np.tile(pos, (2, 1)).astype(np.float64)  # the second frame repeats the first's positions
    inv = np.array([1.0, 0.01])
    angles = np.concatenate([pos[:, :1] * inv, pos[:, 1:] * inv], axis=-1)  # [row angles | column angles]
    np.testing.assert_allclose(cos, np.cos(angles), atol=1e-6)
    np.testing.assert_allclose(sin, np.sin(angles), atol=1e-6)


def test_the_reference_bounds_its_score_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # a few heads' scores at a time give the same result as all at once
    qkv, cos, sin = _inputs([20, 20], 4, 8, seed=6)
    args = (paddle.to_tensor(qkv), paddle.to_tensor(cos), paddle.to_tensor(sin))
    whole = reference_vision_attention(*args, [0, 20, 40], 4, 0.3).numpy()
    monkeypatch.setattr("fd_core.ops.vision_attention._MAX_SCORES", 3 * 20 * 20)
    np.testing.assert_allclose(reference_vision_attention(*args, [0, 20, 40], 4, 0.3).numpy(), whole,
                               rtol=1e-6, atol=1e-6)
