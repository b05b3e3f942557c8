"""wint4 on bf16 activations (``csrc/kernels_int4_bf16.cc``, ``fd_x86_packed_linear`` method 9):
the int4 codes against the activations rounded to bf16 on ``vdpbf16ps``, for a model whose
activations are bf16 (``QuantizedWeight.act_dtype``). Each group's products are exact (an
int4 code and a bf16 value multiply exactly in fp32), so the kernel must equal the float64
dot products of the bf16-rounded activations to fp32 summation error; ``quantized_linear``
and the fused run pick it by the weight's activation dtype."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from bf16_act_cases import FusedCase, decoder_layer
from bf16_act_cases import bf16 as _bf16
from fd_x86.cpu import AVX512_BF16_FLAG, AVX512_VNNI_FLAGS, cpu_features

from fd_core.ops.linear import QuantizedWeight

paddle = pytest.importorskip("paddle")
pytestmark = [
    pytest.mark.skipif(not cpu_features().has(*AVX512_VNNI_FLAGS, AVX512_BF16_FLAG),
                       reason="no AVX-512 VNNI + BF16 on this CPU"),
    pytest.mark.usefixtures("fused_switches_unset"),
]
BF16_METHOD, FP32_METHOD = 9, 1


def _weight(rng: np.random.Generator, n: int, k: int, group: int, act_dtype: str = "bfloat16",
            scales: np.ndarray | None = None) -> tuple[QuantizedWeight, np.ndarray]:
    """A random wint4 weight and its dequantized values ``[n, k]`` in float64."""
    codes = rng.integers(-8, 8, (n, k))
    nib = codes.astype(np.uint8) & np.uint8(0x0F)
    q4 = np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4)))
    per = k if group == -1 else group
    if scales is None:  # a last group may be short (K = 136, group 64)
        scales = (rng.random((n, -(-k // per))) * 0.02 + 0.001).astype(np.float32)
    quant = QuantizedWeight("wint4", paddle.to_tensor(q4), paddle.to_tensor(scales), k, n, group, act_dtype)
    return quant, codes * np.repeat(scales.astype(np.float64), per, axis=1)[:, :k]


def _run(x: np.ndarray, quant: QuantizedWeight, method: int, threads: int = 2) -> np.ndarray:
    from fd_x86.build import load_ops
    from fd_x86.linear import _packed

    packed = _packed(quant)
    assert packed is not None
    return load_ops().fd_x86_packed_linear(paddle.to_tensor(x), packed[0], packed[1], method, quant.out_features,
                                           quant.group_size, threads).numpy()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("group", [8, 64, -1])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 6, 7, 13, 70])
@pytest.mark.parametrize("n", [37, 150])  # 3 blocks (one short word group); 10 (word groups of 4, 4, 2)
def test_the_kernel_is_the_bf16_activations_dot_product(rows: int, group: int, threads: int, n: int) -> None:
    rng = np.random.default_rng(rows * 97 + group + threads + n)
    k = 136  # K % 16 == 8 (a half block of activations); n = 37: an N tail (the last block short)
    quant, deq = _weight(rng, n, k, group)
    x = rng.normal(0, 1, (rows, k)).astype(np.float32) * np.float32(3.0)
    got = _run(x, quant, BF16_METHOD, threads)
    xb = _bf16(x).astype(np.float64)
    want, size = xb @ deq.T, np.abs(xb) @ np.abs(deq).T
    assert got.shape == (rows, n)
    assert np.all(np.abs(got - want) <= 1e-6 * size + 1e-30), np.abs(got - want).max()
    # the fp32 kernel differs by the activations' rounding, by far more than that
    assert np.abs(_run(x, quant, FP32_METHOD, threads) - want).max() > 100 * np.abs(got - want).max()


def test_the_activations_round_to_nearest_even() -> None:
    """One channel with one code 1 at scale 1: the output is the activation as the kernel rounded it.
    A denormal activation counts as zero (``vdpbf16ps`` reads its inputs denormals-are-zero)."""
    k = 16
    codes = np.zeros((1, k), np.int64)
    codes[0, 5] = 1
    nib = codes.astype(np.uint8) & np.uint8(0x0F)
    q4 = np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4)))
    quant = QuantizedWeight("wint4", paddle.to_tensor(q4), paddle.ones([1, 1]), k, 1, -1, "bfloat16")
    ulp = 2.0**-7  # bf16's spacing at [1, 2)
    values = [1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2**-20, -(1 + ulp / 2), 3.0e-39, 1.0e30]
    x = np.zeros((len(values), k), np.float32)
    x[:, 5] = values
    got = _run(x, quant, BF16_METHOD)[:, 0]
    np.testing.assert_array_equal(got[:4], np.float32([1.0, 1 + 2 * ulp, 1 + ulp, -1.0]))
    want = _bf16(x[:, 5])
    want[4] = 0.0
    np.testing.assert_array_equal(got, want)


def test_integer_activations_give_the_fp32_kernels_bits() -> None:
    """Small integers and power-of-two scales are exact either way: method 9 equals method 1."""
    rng = np.random.default_rng(3)
    n, k, group = 40, 64, 16
    scales = np.ldexp(np.ones((n, k // group), np.float32), rng.integers(-3, 3, (n, k // group))).astype(np.float32)
    quant, _ = _weight(rng, n, k, group, scales=scales)
    x = rng.integers(-16, 17, (5, k)).astype(np.float32)
    np.testing.assert_array_equal(_run(x, quant, BF16_METHOD), _run(x, quant, FP32_METHOD))


def test_quantized_linear_takes_it_for_bf16_activations(monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_x86.linear import quantized_linear

    rng = np.random.default_rng(4)
    quant, _ = _weight(rng, 48, 128, 64)
    fp32_model, _ = _weight(np.random.default_rng(4), 48, 128, 64, act_dtype="float32")
    x = rng.normal(0, 1, (3, 128)).astype(np.float32)
    bf16_out, fp32_out = _run(x, quant, BF16_METHOD), _run(x, quant, FP32_METHOD)
    # the model's activations are bf16 (act_dtype) though x86 hands fp32 between its ops
    np.testing.assert_array_equal(quantized_linear(paddle.to_tensor(x), quant).numpy(), bf16_out)
    np.testing.assert_array_equal(quantized_linear(paddle.to_tensor(x), fp32_model).numpy(), fp32_out)
    # the weight alone decides (as in the fused run and the MoE ops): a bf16 x meeting a weight of
    # fp32 activations takes the fp32 kernel; the result comes back in x's dtype
    xb = paddle.to_tensor(x).astype("bfloat16")
    got = quantized_linear(xb, fp32_model)
    assert got.dtype == paddle.bfloat16
    exact = _run(xb.astype("float32").numpy(), fp32_model, FP32_METHOD)
    np.testing.assert_array_equal(got.astype("float32").numpy(),
                                  paddle.to_tensor(exact).astype("bfloat16").astype("float32").numpy())
    monkeypatch.setenv("FD_X86_INT4_BF16", "0")  # the switch: the fp32 kernel
    np.testing.assert_array_equal(quantized_linear(paddle.to_tensor(x), quant).numpy(), fp32_out)


def test_a_byte_layout_weight_is_refused_by_name() -> None:
    """K not a multiple of 8: no word layout, so no bf16 kernel (and quantized_linear keeps method 1)."""
    from fd_x86.linear import quantized_linear, wint4_packed_method

    rng = np.random.default_rng(5)
    quant, deq = _weight(rng, 16, 12, -1)
    x = rng.normal(0, 1, (2, 12)).astype(np.float32)
    with pytest.raises(Exception, match="method 9 needs the word layout"):
        _run(x, quant, BF16_METHOD)
    assert wint4_packed_method(12, -1, True) == FP32_METHOD
    np.testing.assert_allclose(quantized_linear(paddle.to_tensor(x), quant).numpy(), x @ deq.T, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ the fused run


@pytest.mark.parametrize("act_dtype,method", [("bfloat16", BF16_METHOD), ("float32", FP32_METHOD)])
def test_the_fused_run_picks_the_kernel_fd_linear_picks(x86_ops: Any, act_dtype: str, method: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    FusedCase(x86_ops, decoder_layer("wint4", act_dtype, 64)).check(method, "FD_X86_INT4_BF16", FP32_METHOD,
                                                                     monkeypatch)


# ------------------------------------------------------------ routed and shared experts

E, D, INTER = 8, 256, 128  # up_gate: 2 groups of 128 inputs, down: 1


def _deq(q: QuantizedWeight) -> np.ndarray:
    """A wint4 weight's values ``[..., in, out]`` in float64 (the contract's codes times scales)."""
    packed = q.qweight.numpy()
    lo, hi = (packed & 15).astype(np.int64), (packed >> 4).astype(np.int64)
    codes = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.int64)
    codes[..., 0::2], codes[..., 1::2] = np.where(lo > 7, lo - 16, lo), np.where(hi > 7, hi - 16, hi)
    per = q.in_features if q.group_size <= 0 else q.group_size
    values = codes * np.repeat(q.scales.numpy().astype(np.float64), per, axis=-1)[..., :q.in_features]
    return np.swapaxes(values, -1, -2)


def _ffn(x: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """down(silu(gate) * up) with both linears' inputs rounded to bf16 (float64 otherwise)."""
    h = _bf16(x.astype(np.float32)).astype(np.float64) @ up
    gate, upv = h[:, :h.shape[1] // 2], h[:, h.shape[1] // 2:]
    act = gate / (1 + np.exp(-gate)) * upv
    return _bf16(act.astype(np.float32)).astype(np.float64) @ down


def _experts(rng: np.random.Generator, group: int, act_dtype: str) -> tuple[QuantizedWeight, QuantizedWeight]:
    from fd_core.quantization.weights import quantize_array

    def stack(d_in: int, d_out: int) -> QuantizedWeight:
        parts = [quantize_array("wint4", rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05, group)
                 for _ in range(E)]
        return QuantizedWeight("wint4", paddle.to_tensor(np.stack([p[0] for p in parts])),
                               paddle.to_tensor(np.stack([p[1] for p in parts])), d_in, d_out, parts[0][2], act_dtype)

    return stack(D, 2 * INTER), stack(INTER, D)


def _shared_expert(rng: np.random.Generator, act_dtype: str) -> tuple[QuantizedWeight, QuantizedWeight]:
    from fd_core.quantization import quantize_weight

    up = quantize_weight("wint4", rng.standard_normal((D, 2 * INTER)).astype(np.float32) * 0.05, 128)
    down = quantize_weight("wint4", rng.standard_normal((INTER, D)).astype(np.float32) * 0.05, 128)
    up.act_dtype = down.act_dtype = act_dtype
    return up, down


@pytest.mark.parametrize("tokens", [1, 3, 33])  # 1 and 3: the few-token region; 33 the per-expert loop
def test_routed_and_shared_experts_on_bf16_activations(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import fd_x86.moe

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(tokens)
    quant, shared = _experts(rng, 128, "bfloat16"), _shared_expert(rng, "bfloat16")
    x = rng.standard_normal((tokens, D)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:2] for _ in range(tokens)]).astype(np.int64)
    weights = rng.random((tokens, 2)).astype(np.float32)
    up, down = _deq(quant[0]), _deq(quant[1])
    want = np.zeros((tokens, D))
    for t in range(tokens):
        for j in range(2):
            want[t] += weights[t, j] * _ffn(x[t:t + 1], up[ids[t, j]], down[ids[t, j]])[0]
    routed = fd_x86.moe.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids),
                                    quant).numpy()
    np.testing.assert_allclose(routed, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    both = fd_x86.moe.moe_layer_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids),
                                        quant, *shared).numpy()
    want += _ffn(x, _deq(shared[0]), _deq(shared[1]))
    np.testing.assert_allclose(both, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    # the switch, or float32 activations: wint4's fp32 kernels, which differ by the rounding
    monkeypatch.setenv("FD_X86_INT4_BF16", "0")
    off = fd_x86.moe.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids), quant)
    fp32 = _experts(np.random.default_rng(tokens), 128, "float32")
    monkeypatch.delenv("FD_X86_INT4_BF16")
    plain = fd_x86.moe.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids), fp32)
    np.testing.assert_array_equal(off.numpy(), plain.numpy())
    assert np.abs(off.numpy() - routed).max() > 1e-4 * np.abs(want).max()


def test_experts_the_bf16_kernel_cannot_take_run_wint4s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of 64 (not whole 128-input blocks): the op runs wint4's kernels on the fp32 activations."""
    import fd_x86.moe

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(11)
    x = paddle.to_tensor(rng.standard_normal((3, D)).astype(np.float32))
    ids = paddle.to_tensor(np.array([[0, 5], [5, 2], [7, 1]], np.int64))
    weights = paddle.to_tensor(rng.random((3, 2)).astype(np.float32))
    bf16 = fd_x86.moe.moe_experts(x, weights, ids, _experts(np.random.default_rng(1), 64, "bfloat16")).numpy()
    fp32 = fd_x86.moe.moe_experts(x, weights, ids, _experts(np.random.default_rng(1), 64, "float32")).numpy()
    np.testing.assert_array_equal(bf16, fp32)


def test_experts_with_a_short_last_group_read_no_further(monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 384 in groups of 256 (a last group of 128): the op takes the experts with wint4's fp32 kernels
    (the bf16 table kernel needs whole groups), the same result as float32 activations, finite."""
    import fd_x86.moe

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(12)
    d = 384

    def stack(d_in: int, d_out: int, act_dtype: str, seed: int) -> QuantizedWeight:
        r = np.random.default_rng(seed)
        codes = r.integers(-8, 8, (E, d_out, d_in))
        nib = codes.astype(np.uint8) & np.uint8(0x0F)
        q4 = np.ascontiguousarray(nib[..., 0::2] | (nib[..., 1::2] << np.uint8(4)))
        groups = -(-d_in // 256)
        scales = (r.random((E, d_out, groups)) * 0.01 + 0.001).astype(np.float32)
        return QuantizedWeight("wint4", paddle.to_tensor(q4), paddle.to_tensor(scales), d_in, d_out, 256, act_dtype)

    x = paddle.to_tensor(rng.standard_normal((2, d)).astype(np.float32))
    ids = paddle.to_tensor(np.array([[0, 3], [3, 6]], np.int64))
    weights = paddle.to_tensor(rng.random((2, 2)).astype(np.float32))
    outs = [fd_x86.moe.moe_experts(x, weights, ids, (stack(d, 2 * INTER, a, 1), stack(INTER, d, a, 2))).numpy()
            for a in ("bfloat16", "float32")]
    assert np.isfinite(outs[0]).all()
    np.testing.assert_array_equal(outs[0], outs[1])
