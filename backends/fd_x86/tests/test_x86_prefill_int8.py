"""The opt-in int8-activation prefill path (``FD_X86_PREFILL_INT8_ACT=1``,
fd_x86.linear): wint8 and wint4 calls of at least PREFILL_INT8_MIN_ROWS
rows quantize activations per token and run the VNNI kernels; fewer rows,
or the switch off, keep the fp32-activation kernels bit for bit.

The expected values are the arithmetic the module doc states, in numpy:
per-token codes (``rint(x / s_t)``, ``s_t = max|x_t| / 127``), exact integer
dot products per group, groups summed with their scales, times ``s_t``."""

from __future__ import annotations

import numpy as np
import pytest
from fd_x86.cpu import AVX512_VNNI_FLAGS, cpu_features

from fd_core.ops.linear import QuantizedWeight

paddle = pytest.importorskip("paddle")
pytestmark = pytest.mark.skipif(not cpu_features().has(*AVX512_VNNI_FLAGS), reason="no AVX-512 VNNI on this CPU")


def _act_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    amax = np.abs(x).max(-1)
    s = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    return np.clip(np.rint(x / s[:, None]), -127, 127).astype(np.int64), s


def _int4(rng: np.random.Generator, n: int, k: int, group: int) -> tuple[QuantizedWeight, np.ndarray, np.ndarray]:
    codes = rng.integers(-7, 8, (n, k)).astype(np.int8)
    nib = codes.astype(np.uint8) & np.uint8(0x0F)
    q = np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4)))
    scales = rng.uniform(0.01, 0.1, (n, k // group)).astype(np.float32)
    quant = QuantizedWeight("wint4", paddle.to_tensor(q), paddle.to_tensor(scales), k, n, group)
    return quant, codes.astype(np.int64), scales


def _expect_int4(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, group: int) -> np.ndarray:
    xq, s = _act_codes(x)
    m, k = x.shape
    dots = np.einsum("mgk,ngk->mng", xq.reshape(m, -1, group), codes.reshape(codes.shape[0], -1, group))
    return (dots.astype(np.float64) * scales[None].astype(np.float64)).sum(-1) * s[:, None]


@pytest.mark.parametrize("m,n,k,group", [(32, 40, 256, 128), (45, 64, 384, 64), (64, 17, 128, 8), (33, 150, 128, 32)])
def test_wint4_int8_act_matches_the_stated_arithmetic(monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int,
                                                      group: int) -> None:
    from fd_x86.linear import quantized_linear

    rng = np.random.default_rng(m + n + k)
    quant, codes, scales = _int4(rng, n, k, group)
    x = rng.normal(0, 1, (m, k)).astype(np.float32)
    monkeypatch.setenv("FD_X86_PREFILL_INT8_ACT", "1")
    got = quantized_linear(paddle.to_tensor(x), quant).numpy()
    np.testing.assert_allclose(got, _expect_int4(x, codes, scales, group), rtol=1e-5, atol=1e-5)


def test_wint8_int8_act_is_w8a8_on_the_same_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """wint8 and w8a8 share the weight format: the opt-in path gives w8a8's kernel's results."""
    from fd_x86.linear import quantized_linear

    rng = np.random.default_rng(1)
    q = rng.integers(-127, 128, (48, 200)).astype(np.int8)
    s = rng.uniform(0.001, 0.01, 48).astype(np.float32)
    x = paddle.to_tensor(rng.normal(0, 1, (40, 200)).astype(np.float32))
    w8a8 = quantized_linear(x, QuantizedWeight("w8a8", paddle.to_tensor(q), paddle.to_tensor(s), 200, 48)).numpy()
    monkeypatch.setenv("FD_X86_PREFILL_INT8_ACT", "1")
    got = quantized_linear(x, QuantizedWeight("wint8", paddle.to_tensor(q), paddle.to_tensor(s), 200, 48)).numpy()
    np.testing.assert_array_equal(got, w8a8)
    xq, xs = _act_codes(x.numpy())
    want = (xq @ q.T.astype(np.int64)).astype(np.float64) * xs[:, None] * s[None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("method", ["wint8", "wint4"])
def test_small_calls_and_switch_off_keep_fp32_activations(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    from fd_x86.linear import PREFILL_INT8_MIN_ROWS, quantized_linear

    rng = np.random.default_rng(2)
    if method == "wint4":
        quant, _, _ = _int4(rng, 32, 256, 128)
    else:
        quant = QuantizedWeight("wint8", paddle.to_tensor(rng.integers(-127, 128, (32, 256)).astype(np.int8)),
                                paddle.to_tensor(rng.uniform(0.001, 0.01, 32).astype(np.float32)), 256, 32)
    big = paddle.to_tensor(rng.normal(0, 1, (PREFILL_INT8_MIN_ROWS, 256)).astype(np.float32))
    small = big[: PREFILL_INT8_MIN_ROWS - 1]
    monkeypatch.delenv("FD_X86_PREFILL_INT8_ACT", raising=False)
    default_big, default_small = quantized_linear(big, quant).numpy(), quantized_linear(small, quant).numpy()
    monkeypatch.setenv("FD_X86_PREFILL_INT8_ACT", "1")
    np.testing.assert_array_equal(quantized_linear(small, quant).numpy(), default_small)
    opt_in = quantized_linear(big, quant).numpy()
    assert not np.array_equal(opt_in, default_big)  # int8 activations: other numerics
    np.testing.assert_allclose(opt_in, default_big, rtol=0.1, atol=0.05 * np.abs(default_big).max())
