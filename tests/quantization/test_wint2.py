"""wint2: FastDeploy's 2-bit expert format decoded element by element in
numpy (the Triton kernel's arithmetic written out), against fd_core's decoder
and the CPU reference's linear and MoE on it."""

from __future__ import annotations

import math

import numpy as np
import paddle
import pytest

from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization import dequantize
from fd_core.quantization.wint2 import decode_wint2, encode_wint2, pack_scales


def element(quant_weight, weight_scale, super_scales, code_scale, code_zp, k: int, n: int) -> float:
    """One weight as moe_wint2_ffn_kernel decodes it."""
    r, j = divmod(k, 4)
    code = int(math.floor(float(quant_weight[r, n]) * float(code_scale[n]) + float(code_zp[n]) + 0.5))
    q = ((code >> (9 - 3 * j)) & 0x3F) - 32
    packed = int(weight_scale[k // 128, n])
    group = (packed >> 4) & 0xF if (k // 64) % 2 == 0 else packed & 0xF
    return q * group * float(super_scales[n])


def random_tensors(rng, in_f: int, out_f: int):
    return (rng.integers(0, 256, (in_f // 4, out_f)).astype(np.uint8),
            rng.integers(0, 256, (in_f // 128, out_f)).astype(np.uint8),
            rng.uniform(1e-3, 2e-2, out_f).astype(np.float32),
            rng.uniform(60, 129, out_f).astype(np.float32),  # codes stay within 15 bits
            rng.uniform(-3, 3, out_f).astype(np.float32))


def quant_of(tensors) -> QuantizedWeight:
    qw, ws, sup, cs, zp = tensors
    return QuantizedWeight("wint2", paddle.to_tensor(qw), paddle.to_tensor(pack_scales(ws, sup, cs, zp)),
                           4 * qw.shape[0], qw.shape[1], 64)


def test_decoding_matches_the_kernel_element_by_element():
    rng = np.random.default_rng(0)
    tensors = random_tensors(rng, 256, 24)
    want = np.array([[element(*tensors, k, n) for n in range(24)] for k in range(256)], dtype=np.float32)
    np.testing.assert_allclose(decode_wint2(*tensors), want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(dequantize(quant_of(tensors)).numpy(), want, rtol=1e-6, atol=0)


def test_bad_shapes_are_named():
    qw, ws, sup, cs, zp = random_tensors(np.random.default_rng(1), 128, 8)
    with pytest.raises(ValueError, match=r"weight_scale \[in/128, out\].*\[2, 8\]"):
        decode_wint2(qw, np.zeros((2, 8), np.uint8), sup, cs, zp)


def test_linear_and_moe_on_the_cpu_reference(cpu_backend):
    ops = cpu_backend.ops
    rng = np.random.default_rng(2)
    hidden, inter, experts, tokens = 128, 128, 3, 5
    x = rng.normal(0, 1, (tokens, hidden)).astype(np.float32)
    tensors = random_tensors(rng, hidden, 40)
    out = ops.linear(paddle.to_tensor(x), None, None, quant_of(tensors)).numpy()
    np.testing.assert_allclose(out, x.astype(np.float64) @ decode_wint2(*tensors), rtol=1e-4, atol=1e-4)
    ups = [random_tensors(rng, hidden, 2 * inter) for _ in range(experts)]
    downs = [random_tensors(rng, inter, hidden) for _ in range(experts)]

    def stack(parts):
        qs = [quant_of(p) for p in parts]
        return QuantizedWeight("wint2", paddle.stack([q.qweight for q in qs]), paddle.stack([q.scales for q in qs]),
                               qs[0].in_features, qs[0].out_features, 64)

    ids = np.array([[0, 1], [2, 0], [1, 2], [0, 2], [1, 0]], dtype=np.int64)
    weights = rng.uniform(0.1, 1, (tokens, 2)).astype(np.float32)
    got = ops.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids), None, None,
                          (stack(ups), stack(downs))).numpy()
    want = np.zeros((tokens, hidden))
    for t in range(tokens):
        for k in range(2):
            e = int(ids[t, k])
            h = x[t].astype(np.float64) @ decode_wint2(*ups[e])
            act = h[:inter] / (1 + np.exp(-h[:inter])) * h[inter:]
            want[t] += weights[t, k] * (act @ decode_wint2(*downs[e]))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


def test_the_test_encoder_round_trips_roughly():
    w = np.random.default_rng(3).normal(0, 0.02, (256, 16)).astype(np.float32)
    back = decode_wint2(*encode_wint2(w))
    assert back.shape == w.shape
    # 2 bits per weight through a fixed 256-entry code table: coarse (about 2-bit SNR), but the right weight
    assert np.abs(back - w).mean() < 0.5 * np.abs(w).mean()
    assert np.corrcoef(back.ravel(), w.ravel())[0, 1] > 0.85
