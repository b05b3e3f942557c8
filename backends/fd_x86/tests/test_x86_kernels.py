"""The native ops against the layout contract, per ISA path, on odd shapes."""

from __future__ import annotations

import numpy as np
import pytest
from fd_x86.cpu import AVX2_FLAGS, AVX512_VNNI_FLAGS, cpu_features
from x86_contract import linear, quantize, to_paddle

paddle = pytest.importorskip("paddle")

_NO_VNNI = pytest.mark.skipif(not cpu_features().has(*AVX512_VNNI_FLAGS), reason="no AVX-512 VNNI on this CPU")
# "avx512" runs the kernels on the repacked weight (the default there),
# "avx512-contract" the AVX-512 kernels on the contract layout (FD_X86_REPACK=0)
ISAS = [
    pytest.param("avx2", marks=pytest.mark.skipif(not cpu_features().has(*AVX2_FLAGS), reason="no AVX2+FMA")),
    pytest.param("avx512", marks=_NO_VNNI),
    pytest.param("avx512-contract", marks=_NO_VNNI),
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


def _isa(isa: str, monkeypatch: pytest.MonkeyPatch) -> str:
    if isa == "avx512-contract":
        monkeypatch.setenv("FD_X86_REPACK", "0")
        return "avx512"
    monkeypatch.delenv("FD_X86_REPACK", raising=False)
    return isa


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("d_in,d_out,group", SHAPES)
def test_op_matches_contract(ops, isa: str, method: str, rows: int, d_in: int, d_out: int, group: int,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_x86.linear import quantized_linear

    isa = _isa(isa, monkeypatch)
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
def test_w8a8_rounds_half_to_even(ops, isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_x86.linear import quantized_linear

    isa = _isa(isa, monkeypatch)
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


@_NO_VNNI
@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
def test_packed_equals_contract_kernels(ops, method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The repacked path and the contract-layout path agree (w8a8 bit for bit:
    the same int32 sums and products), across row tiles and an N tail."""
    import fd_x86.linear
    from fd_x86.linear import quantized_linear

    monkeypatch.setattr(fd_x86.linear, "WINT8_PACKED_MAX_ROWS", 1 << 30)  # every packed row tile
    x, w = _inputs(37, 384, 200, seed=5)
    q = to_paddle(quantize(method, w, group_size=64))
    monkeypatch.setenv("FD_X86_REPACK", "0")
    want = quantized_linear(paddle.to_tensor(x), q, isa="avx512", threads=2).numpy()
    monkeypatch.delenv("FD_X86_REPACK")
    got = quantized_linear(paddle.to_tensor(x), q, isa="avx512", threads=2).numpy()
    if method == "w8a8":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@_NO_VNNI
def test_packed_weight_is_cached_and_follows_replacement(ops, monkeypatch: pytest.MonkeyPatch) -> None:
    import fd_x86.linear as lin

    monkeypatch.delenv("FD_X86_REPACK", raising=False)
    packs = []
    real = lin.pack_weight
    monkeypatch.setattr(lin, "pack_weight", lambda *a: packs.append(1) or real(*a))
    rng = np.random.default_rng(9)
    x = paddle.to_tensor(rng.normal(0, 1, (2, 64)).astype(np.float32))
    q = to_paddle(quantize("wint8", rng.normal(0, 0.1, (64, 24)).astype(np.float32)))
    first = lin.quantized_linear(x, q).numpy()
    lin.quantized_linear(x, q)
    assert len(packs) == 1 and "x86" in q.backend_cache
    q2 = quantize("wint8", rng.normal(0, 0.1, (64, 24)).astype(np.float32))
    q.qweight, q.scales = paddle.to_tensor(q2["qweight"]), paddle.to_tensor(q2["scales"])  # a reload
    got = lin.quantized_linear(x, q).numpy()
    assert len(packs) == 2
    np.testing.assert_allclose(got, linear(x.numpy(), q2), rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, first)


def test_pack_weight_layouts() -> None:
    from fd_x86.linear import pack_weight

    rng = np.random.default_rng(2)
    q8 = rng.integers(-127, 128, (20, 6), dtype=np.int8)
    s8 = rng.random(20, dtype=np.float32)
    w, s = pack_weight("wint8", q8, s8)  # two 16-channel blocks side by side per k
    assert w.shape == (1, 6, 32) and w[0, 3, 18] == q8[18, 3] and w[0, 3, 7] == q8[7, 3] and w[0, 3, 21] == 0
    assert s is s8
    w, _ = pack_weight("wint8", np.ones((40, 6), np.int8), s8)
    assert w.shape == (2, 6, 32) and w[1, 0, 7] == 1 and w[1, 0, 8] == 0
    w, _ = pack_weight("w8a8", q8, s8)  # K padded to 8, w ^ 0x80 (0 -> 128)
    assert w.shape == (2, 2, 16, 4) and w.dtype == np.uint8
    assert w[1, 1, 2, 1] == (int(q8[18, 5]) + 128) and w[1, 1, 2, 2] == 128 and w[1, 0, 9, 0] == 128
    q4 = rng.integers(0, 256, (20, 4), dtype=np.uint8)
    s4 = rng.random((20, 2), dtype=np.float32)
    w, s = pack_weight("wint4", q4, s4)
    assert w.shape == (2, 4, 16) and w[1, 2, 3] == q4[19, 2] and w[1, 2, 4] == 0
    assert s.shape == (2, 2, 16) and s[1, 1, 3] == s4[19, 1] and s[1, 1, 4] == 0
