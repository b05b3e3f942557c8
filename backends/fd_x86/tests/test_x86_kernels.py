"""The native ops against the layout contract, per ISA path, on odd shapes."""

from __future__ import annotations

import numpy as np
import pytest
from fd_x86.cpu import AVX2_FLAGS, AVX512_VNNI_FLAGS, cpu_features
from x86_contract import linear, quantize, to_paddle

paddle = pytest.importorskip("paddle")

ISAS = [
    pytest.param("avx2", marks=pytest.mark.skipif(not cpu_features().has(*AVX2_FLAGS), reason="no AVX2+FMA")),
    pytest.param("avx512", marks=pytest.mark.skipif(
        not cpu_features().has(*AVX512_VNNI_FLAGS), reason="no AVX-512 VNNI on this CPU")),
]
ROWS = (1, 3, 8, 13, 32)
# (in, out, wint4 group): tails in K (not a multiple of 16/64) and in N (not of 4/32)
SHAPES = [(64, 96, 32), (100, 37, -1), (130, 67, 10), (1024, 300, 128), (200, 5, 40)]


@pytest.fixture(scope="module")
def ops():
    from fd_x86.build import load_ops

    return load_ops()  # builds once per key (~30 s), then cached in ~/.cache/fd_x86


def _inputs(rows: int, d_in: int, d_out: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (rows, d_in)).astype(np.float32)
    if rows >= 3:
        x[1] = 0.0  # a zero row: w8a8 uses s_t = 1, every output is 0
    w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
    return x, w


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("d_in,d_out,group", SHAPES)
def test_op_matches_contract(ops, isa: str, method: str, rows: int, d_in: int, d_out: int, group: int) -> None:
    from fd_x86.linear import quantized_linear

    x, w = _inputs(rows, d_in, d_out, seed=rows * 7919 + d_in)
    q = quantize(method, w, group_size=group)
    want = linear(x, q)
    got = quantized_linear(paddle.to_tensor(x), to_paddle(q), isa=isa, threads=2).numpy()
    assert got.shape == (rows, d_out)
    if rows >= 3:
        assert not got[1].any(), "a zero row of x must give a zero row of y"
    # w8a8: the same integer sums and the same two fp32 products -> equal up to rounding
    rtol, atol = (1e-6, 1e-6) if method == "w8a8" else (1e-4, 1e-5)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("isa", ISAS)
def test_w8a8_rounds_half_to_even(ops, isa: str) -> None:
    from fd_x86.linear import quantized_linear

    # s_t = 127 / 127 = 1, so x / s_t is exactly x: ties at 0.5, 1.5, 2.5, -0.5, -2.5
    x = np.zeros((1, 70), np.float32)
    x[0, :6] = [127.0, 0.5, 1.5, 2.5, -0.5, -2.5]
    q = dict(method="w8a8", qweight=np.eye(70, dtype=np.int8), scales=np.ones(70, np.float32),
             in_features=70, out_features=70, group_size=-1)
    got = quantized_linear(paddle.to_tensor(x), to_paddle(q), isa=isa, threads=1).numpy()
    np.testing.assert_array_equal(got[0, :6], [127.0, 0.0, 2.0, 2.0, -0.0, -2.0])


def test_threads_do_not_change_results(ops) -> None:
    from fd_x86.linear import quantized_linear

    x, w = _inputs(13, 1024, 300, seed=1)
    q = to_paddle(quantize("wint4", w))
    one = quantized_linear(paddle.to_tensor(x), q, threads=1).numpy()
    two = quantized_linear(paddle.to_tensor(x), q, threads=2).numpy()
    np.testing.assert_array_equal(one, two)


def test_batched_and_noncontiguous_inputs(ops) -> None:
    from fd_x86.linear import quantized_linear

    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (2, 3, 256)).astype(np.float32)
    q = quantize("wint8", rng.normal(0, 0.1, (128, 40)).astype(np.float32))
    xt = paddle.to_tensor(x)[:, :, ::2]  # a strided view [2, 3, 128]
    got = quantized_linear(xt, to_paddle(q)).numpy()
    want = linear(x[:, :, ::2].reshape(6, 128), q).reshape(2, 3, 40)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_bad_inputs_raise_with_shapes(ops) -> None:
    from fd_x86.linear import quantized_linear

    q = to_paddle(quantize("wint8", np.ones((64, 8), np.float32)))
    with pytest.raises(ValueError, match="64"):
        quantized_linear(paddle.ones([2, 32]), q)
    with pytest.raises(ValueError, match="isa"):
        quantized_linear(paddle.ones([2, 64]), q, isa="sse2")
    q.scales = paddle.ones([7])
    with pytest.raises(Exception, match="scales must have N = 8"):
        quantized_linear(paddle.ones([2, 64]), q)
