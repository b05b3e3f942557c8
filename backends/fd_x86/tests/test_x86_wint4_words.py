"""Packed wint4 in words (8 codes per uint32 lane, ``Wint4Words``): the
layout ``pack_weight`` writes and the kernel's results, exact where fp32 is.

With integer activations, power-of-two scales and small sums every product
and partial sum is exact in fp32, so both packed layouts (words where K and
the group are multiples of 8, bytes otherwise) must give the exact integer
dot products, bit for bit, whatever their order of accumulation."""

from __future__ import annotations

import numpy as np
import pytest
from fd_x86.cpu import AVX512_VNNI_FLAGS, cpu_features

from fd_core.ops.linear import QuantizedWeight

paddle = pytest.importorskip("paddle")
pytestmark = pytest.mark.skipif(not cpu_features().has(*AVX512_VNNI_FLAGS), reason="no AVX-512 VNNI on this CPU")


def _codes(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Signed codes ``[n, k]`` in [-8, 7] and their contract bytes ``[n, k / 2]``."""
    codes = rng.integers(-8, 8, (n, k)).astype(np.int8)
    nib = codes.astype(np.uint8) & np.uint8(0x0F)
    return codes, np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4)))


def test_pack_weight_words_layout() -> None:
    from fd_x86.linear import pack_weight, wint4_words
    from fd_x86.packing import WORD_GROUP

    rng = np.random.default_rng(0)
    _, q4 = _codes(rng, 100, 16)  # K = 16: two words per channel; 7 blocks: a group of 4 and a short one of 3
    s4 = rng.random((100, 2), dtype=np.float32)  # group 8
    w, s = pack_weight("wint4", q4, s4, 8)
    assert w.dtype == np.uint8 and w.shape == (7, 2, 64)  # [N16, K/8, 16 words of 4 bytes] in size
    words = w.view("<u4").reshape(-1)
    assert WORD_GROUP == 4
    for b in range(7):
        g0 = b - b % 4
        in_group = min(4, 7 - g0)
        for kb in range(2):
            for c in range(16):
                at = g0 * 2 * 16 + kb * in_group * 16 + (b - g0) * 16 + c  # group g0: [K/8][its blocks][16]
                n = 16 * b + c
                want = int.from_bytes(q4[n, 4 * kb:4 * kb + 4].tobytes(), "little") if n < 100 else 0
                assert words[at] == want, (b, kb, c)
    assert s.shape == (7, 2, 16) and s[6, 1, 3] == s4[99, 1] and s[6, 1, 4] == 0
    assert wint4_words(16, 8) and wint4_words(16, -1) and not wint4_words(16, 4) and not wint4_words(12, -1)
    # without a group size it is K / G, as before: 4 here, so the byte layout
    assert pack_weight("wint4", q4[:20], np.ones((20, 4), np.float32))[0].shape == (2, 8, 16)


@pytest.mark.parametrize("group", [8, 32, -1, 4])  # 4: the byte layout, for comparison
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 13])
@pytest.mark.parametrize("n", [37, 150])  # 3 blocks (one short word group); 10 (groups of 4, 4, 2)
def test_packed_wint4_exact_integer_dot_products(rows: int, group: int, n: int) -> None:
    from fd_x86.linear import quantized_linear

    rng = np.random.default_rng(rows * 31 + group + n)
    k = 64
    codes, q4 = _codes(rng, n, k)
    groups = 1 if group == -1 else k // group
    exps = rng.integers(-3, 3, (n, groups))
    scales = np.ldexp(np.ones((n, groups), np.float32), exps).astype(np.float32)
    x = rng.integers(-16, 17, (rows, k)).astype(np.float32)
    quant = QuantizedWeight("wint4", paddle.to_tensor(q4), paddle.to_tensor(scales), k, n, group)
    got = quantized_linear(paddle.to_tensor(x), quant, isa="avx512", threads=2).numpy()
    per = k if group == -1 else group
    deq = codes.astype(np.float64).reshape(n, groups, per) * scales.astype(np.float64)[:, :, None]
    want = x.astype(np.float64) @ deq.reshape(n, k).T
    np.testing.assert_array_equal(got, want.astype(np.float32))
