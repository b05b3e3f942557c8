"""block_wise_fp8: e4m3 rounding, the 128x128 block layout and the reference
linear / MoE numerics, each against numpy written out independently here."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.quantization import dequantize, expert_weight, parse_quantization, quantize_weight
from fd_core.quantization.block_fp8 import E4M3_VALUES, encode_e4m3, quantize_activations_fp8

from .test_reference import stacked

FINITE = np.array(sorted({float(v) for v in E4M3_VALUES if np.isfinite(v)}))  # -448 .. 448, one zero


def nearest_e4m3(values: np.ndarray) -> np.ndarray:
    """Round each value to the nearest finite e4m3 value by brute force; a tie
    goes to the value whose mantissa is even (its code's lowest bit 0)."""
    out = np.empty(values.shape, dtype=np.float64)
    for index, v in np.ndenumerate(values.astype(np.float64)):
        dist = np.abs(FINITE - v)
        best = np.flatnonzero(dist == dist.min())
        if len(best) > 1:  # a tie between two neighbours: the even code
            codes = [int(encode_e4m3(np.float32(FINITE[b]))) for b in best]
            best = [b for b, c in zip(best, codes, strict=True) if c & 1 == 0]
        out[index] = FINITE[best[0]]
    return out


@pytest.fixture(scope="module")
def ops(cpu_backend):
    return cpu_backend.ops


def test_e4m3_table_and_rounding():
    assert E4M3_VALUES[0x7E] == 448 and E4M3_VALUES[0x08] == 2.0**-6 and E4M3_VALUES[0x01] == 2.0**-9
    assert np.isnan(E4M3_VALUES[0x7F]) and np.isnan(E4M3_VALUES[0xFF]) and E4M3_VALUES[0xB8] == -1.0
    rng = np.random.default_rng(0)
    mids = (FINITE[:-1] + FINITE[1:]) / 2  # every tie
    values = np.concatenate([rng.normal(0, 1, 3000) * np.exp(rng.uniform(-10, 6, 3000)), mids,
                             FINITE, [0.0, 2.0**-11, 447.9, 448.0]]).astype(np.float32)
    values = np.clip(values, -448, 448)
    got = E4M3_VALUES[encode_e4m3(values)]
    np.testing.assert_array_equal(got, nearest_e4m3(values))
    # and paddle's own float8_e4m3fn cast (what the activations go through) agrees
    cast = paddle.to_tensor(values).astype("float8_e4m3fn").astype("float32").numpy()
    np.testing.assert_array_equal(got, cast)
    assert E4M3_VALUES[encode_e4m3(np.float32(1000.0))] == 448  # saturates, never NaN


@pytest.mark.parametrize("d_in,d_out", [(256, 128), (200, 130), (64, 300)])
def test_weight_layout_block_by_block(d_in, d_out):
    rng = np.random.default_rng(d_in + d_out)
    w = rng.normal(0, 0.05, (d_in, d_out)).astype(np.float32)
    w[:, :128] *= 30.0  # blocks of very different ranges
    w[:, -2:] = 0.0 if d_out % 128 else w[:, -2:]  # a (partial) block that is nearly zero
    q = quantize_weight("block_wise_fp8", w)
    codes, scales = q.qweight.numpy(), q.scales.numpy()
    ob, ib = -(-d_out // 128), -(-d_in // 128)
    assert codes.shape == (d_out, d_in) and codes.dtype == np.uint8
    assert scales.shape == (ob, ib) and scales.dtype == np.float32
    w_t = w.T
    for bo in range(ob):
        for bi in range(ib):
            block = w_t[bo * 128:(bo + 1) * 128, bi * 128:(bi + 1) * 128]
            amax = max(float(np.abs(block).max()), 1e-4)
            assert scales[bo, bi] == np.float32(np.float32(amax) / np.float32(448))
            want = nearest_e4m3(block * (np.float32(448) / np.float32(amax)))
            got = E4M3_VALUES[codes[bo * 128:(bo + 1) * 128, bi * 128:(bi + 1) * 128]]
            np.testing.assert_array_equal(got, want, err_msg=f"block ({bo}, {bi})")
    deq = dequantize(q).numpy()  # [in, out]
    np.testing.assert_allclose(deq, (E4M3_VALUES[codes] * np.repeat(np.repeat(scales, 128, 0), 128, 1)
                                     [:d_out, :d_in]).T, rtol=0, atol=0)
    assert np.abs(deq - w).max() <= np.abs(w).max() / 16  # e4m3: 3 mantissa bits


def numpy_block_fp8_linear(x: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """FastDeploy's arithmetic: per token and group of 128, e4m3 activations;
    per group an exact dot product of e4m3 values, times both scales; float64."""
    tokens, d_in = x.shape
    d_out = codes.shape[0]
    w_vals = E4M3_VALUES[codes].astype(np.float64)  # [out, in]
    y = np.zeros((tokens, d_out))
    for g in range(-(-d_in // 128)):
        cols = slice(g * 128, min((g + 1) * 128, d_in))
        xg = x[:, cols].astype(np.float32)
        s = np.maximum(np.abs(xg).max(axis=1), np.float32(1e-10)) / np.float32(448)  # [T]
        xq = nearest_e4m3(np.clip(xg / s[:, None], -448, 448))
        w_scale = np.repeat(scales[:, g].astype(np.float64), 128)[:d_out]  # [out]
        y += (xq @ w_vals[:, cols].T) * s.astype(np.float64)[:, None] * w_scale[None, :]
    return y


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("tokens,d_in,d_out", [(1, 256, 96), (9, 200, 130), (5, 128, 257), (3, 64, 8)])
def test_linear_matches_numpy(ops, tokens, d_in, d_out, with_bias):
    rng = np.random.default_rng(tokens * 1000 + d_in + d_out)
    x = rng.normal(0, 1, (tokens, d_in)).astype(np.float32)
    x[0, : min(d_in, 128)] *= 50.0  # one group of one token far larger than the rest
    if tokens > 2:
        x[2] = 0.0  # a zero token: its scales are 1e-10 / 448 and its output exactly the bias
    w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
    b = rng.normal(0, 1, d_out).astype(np.float32) if with_bias else None
    q = quantize_weight("block_wise_fp8", w)
    out = ops.linear(paddle.to_tensor(x), None, None if b is None else paddle.to_tensor(b), q)
    want = numpy_block_fp8_linear(x, q.qweight.numpy(), q.scales.numpy()) + (0.0 if b is None else b)
    assert out.shape == [tokens, d_out] and out.dtype == paddle.float32
    # fp32 sums over the row: absolute error relative to the row's largest outputs
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(want).max()))
    if tokens > 2:
        np.testing.assert_array_equal(out.numpy()[2], 0.0 if b is None else b)
    assert np.abs(out.numpy() - (x @ w + (0 if b is None else b))).mean() < 0.05 * np.abs(x @ w).mean()


def test_activation_scales_are_per_token_per_group():
    x = np.zeros((2, 300), dtype=np.float32)
    x[0, 5], x[0, 200], x[1, 299] = 896.0, -3.0, 1.5
    values, scales = quantize_activations_fp8(paddle.to_tensor(x))
    np.testing.assert_allclose(scales.numpy(), [[2.0, 3 / 448, 1e-10 / 448], [1e-10 / 448, 1e-10 / 448, 1.5 / 448]],
                               rtol=1e-6)
    assert values.shape == [2, 300] and values.numpy()[0, 5] == 448 and values.numpy()[0, 200] == -448


def test_empty_batch(ops):
    q = quantize_weight("block_wise_fp8", np.ones((128, 16), dtype=np.float32))
    assert ops.linear(paddle.zeros([0, 128]), None, None, q).shape == [0, 16]


def test_moe_experts_stack_block_scales_per_expert(ops):
    rng = np.random.default_rng(3)
    num_experts, hidden, inter, tokens = 4, 192, 64, 7
    up_gate = rng.normal(0, hidden**-0.5, (num_experts, hidden, 2 * inter)).astype(np.float32)
    down = rng.normal(0, inter**-0.5, (num_experts, inter, hidden)).astype(np.float32)
    quant = (stacked("block_wise_fp8", up_gate, 128), stacked("block_wise_fp8", down, 128))
    assert list(quant[0].scales.shape) == [num_experts, 1, 2] and list(quant[1].scales.shape) == [num_experts, 2, 1]
    for e in range(num_experts):
        alone = quantize_weight("block_wise_fp8", down[e])
        np.testing.assert_array_equal(expert_weight(quant[1], e).qweight.numpy(), alone.qweight.numpy())
        np.testing.assert_array_equal(expert_weight(quant[1], e).scales.numpy(), alone.scales.numpy())
    x = rng.normal(0, 1, (tokens, hidden)).astype(np.float32)
    ids = np.stack([np.arange(tokens) % 4, (np.arange(tokens) + 1) % 4], axis=1).astype(np.int64)
    weights = rng.uniform(0.1, 1, (tokens, 2)).astype(np.float32)
    out = ops.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids),
                          None, None, quant).numpy()
    want = np.zeros((tokens, hidden))
    for t in range(tokens):
        for k in range(2):
            e = int(ids[t, k])
            up = expert_weight(quant[0], e)
            h = numpy_block_fp8_linear(x[t:t + 1], up.qweight.numpy(), up.scales.numpy())
            act = (h[:, :inter] / (1 + np.exp(-h[:, :inter])) * h[:, inter:]).astype(np.float32)
            dn = expert_weight(quant[1], e)
            want[t] += weights[t, k] * numpy_block_fp8_linear(act, dn.qweight.numpy(), dn.scales.numpy())[0]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_flag_forms():
    config = parse_quantization("block_wise_fp8", "Ernie4_5_MoeForCausalLM")
    assert config.dense_method == config.moe_method == "block_wise_fp8" and config.lm_head_method is None
    mixed = parse_quantization({"quantization": "mix_quant", "dense_quant_type": "block_wise_fp8",
                                "moe_quant_type": "wint4"})
    assert (mixed.dense_method, mixed.moe_method) == ("block_wise_fp8", "wint4")
