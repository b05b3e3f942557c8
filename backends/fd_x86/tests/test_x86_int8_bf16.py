"""wint8 on bf16 activations (``csrc/kernels_int8_bf16.cc``): ``fd_x86_packed_linear`` method 10 on
the pairs layout for the linears, and MoE method code 7 on the experts' contract layout, for a model
whose activations are bf16 (``QuantizedWeight.act_dtype``). An int8 code and a bf16 activation
multiply exactly in fp32, so both kernels must equal the float64 dot products of the bf16-rounded
activations to fp32 summation error. Each output sums its products in one order at every row count,
so a row's bits must not depend on how many rows the call had."""

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
BF16_METHOD, PACKED_FP32, CONTRACT_FP32, INT8_ACT = 10, 0, 3, 7  # INT8_ACT: the opt-in int8-activation kernel


def _weight(rng: np.random.Generator, n: int, k: int, act_dtype: str = "bfloat16",
            scales: np.ndarray | None = None) -> tuple[QuantizedWeight, np.ndarray]:
    """A random wint8 weight (codes over the whole int8 range) and its values ``[n, k]`` in float64."""
    codes = rng.integers(-128, 128, (n, k)).astype(np.int8)
    if scales is None:
        scales = (rng.random(n) * 0.02 + 0.001).astype(np.float32)
    quant = QuantizedWeight("wint8", paddle.to_tensor(codes), paddle.to_tensor(scales), k, n, -1, act_dtype)
    return quant, codes.astype(np.float64) * scales.astype(np.float64)[:, None]


def _run(x: np.ndarray, quant: QuantizedWeight, method: int = BF16_METHOD, threads: int = 2) -> np.ndarray:
    from fd_x86.build import load_ops
    from fd_x86.linear import _packed

    if method in (CONTRACT_FP32, INT8_ACT):  # the contract weight, read in place
        w, s = quant.qweight, quant.scales
    else:
        packed = _packed(quant, "wint8_pairs" if method == BF16_METHOD else None)
        assert packed is not None
        w, s = packed
    return load_ops().fd_x86_packed_linear(paddle.to_tensor(x), w, s, method, quant.out_features, -1,
                                           threads).numpy()


def test_the_pairs_layout() -> None:
    """Per input pair of a work item 64 bytes: block b's channel c at 32 b + 2 c and 32 b + 2 c + 1."""
    from fd_x86.linear import pack_weight

    q = np.arange(40 * 6).reshape(40, 6).astype(np.int8)
    w, s = pack_weight("wint8_pairs", q, np.ones(40, np.float32))
    assert w.shape == (2, 3, 64) and w.dtype == np.int8  # 40 channels -> 2 work items of 32, padded
    for n in range(64):
        for k in range(6):
            item, b, c = n // 32, (n % 32) // 16, n % 16
            assert w[item, k // 2, 32 * b + 2 * c + k % 2] == (q[n, k] if n < 40 else 0)
    with pytest.raises(ValueError, match="even K, got 5"):
        pack_weight("wint8_pairs", q[:, :5], np.ones(40, np.float32))


@pytest.mark.parametrize("rows", [1, 3, 5, 13, 70])  # table tiles, 12-row tiles converting alone, the panel
def test_every_code_converts_exactly(rows: int) -> None:
    """Channel n holds the one code n - 128 (all 256, -128 included: the table conversion's patched
    case, whose |q| reads as index 0) against activations 1.0: each output is exactly 64 x code x scale."""
    codes = np.repeat((np.arange(256) - 128).astype(np.int8)[:, None], 64, axis=1)
    scales = np.full(256, 0.5, np.float32)
    quant = QuantizedWeight("wint8", paddle.to_tensor(codes), paddle.to_tensor(scales), 64, 256, -1, "bfloat16")
    got = _run(np.ones((rows, 64), np.float32), quant)
    np.testing.assert_array_equal(got, np.tile((np.arange(256) - 128) * 32.0, (rows, 1)).astype(np.float32))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 12, 13, 16, 17, 70])
def test_the_kernel_is_the_bf16_activations_dot_product(rows: int, threads: int) -> None:
    rng = np.random.default_rng(rows * 31 + threads)
    n, k = 37, 138  # an N tail (one work item of 3 blocks, the last short: 1-4 rows take all 3) and K % 16 == 10
    quant, deq = _weight(rng, n, k)
    x = rng.normal(0, 1, (rows, k)).astype(np.float32) * np.float32(3.0)
    got = _run(x, quant, threads=threads)
    xb = _bf16(x).astype(np.float64)
    want, size = xb @ deq.T, np.abs(xb) @ np.abs(deq).T
    assert got.shape == (rows, n)
    assert np.all(np.abs(got - want) <= 1e-6 * size + 1e-30), np.abs(got - want).max()
    # the fp32 kernels differ by the activations' rounding, by far more than that
    for fp32 in (PACKED_FP32, CONTRACT_FP32):
        assert np.abs(_run(x, quant, fp32, threads) - want).max() > 100 * np.abs(got - want).max()


def test_a_rows_bits_do_not_depend_on_the_calls_rows() -> None:
    """Row tiles of 1-4 rows over a work item's 4 (or 3) blocks, up to 12 rows over 2, and from 16
    rows the panel of converted codes: every row's output equals its one-row call bit for bit (N = 100:
    a work item of 4 blocks and one of 3; several row chunks)."""
    rng = np.random.default_rng(9)
    quant, _ = _weight(rng, 100, 512)
    x = rng.normal(0, 1, (75, 512)).astype(np.float32)
    alone = np.concatenate([_run(x[i:i + 1], quant) for i in range(75)])
    for rows in (2, 4, 7, 12, 16, 29, 64, 75):
        np.testing.assert_array_equal(_run(x[:rows], quant), alone[:rows])


def test_the_activations_round_to_nearest_even() -> None:
    """One channel with one code 1 at scale 1: the output is the activation as the kernel rounded it.
    A denormal activation counts as zero (``vdpbf16ps`` reads its inputs denormals-are-zero)."""
    k = 32
    codes = np.zeros((1, k), np.int8)
    codes[0, 5] = 1
    quant = QuantizedWeight("wint8", paddle.to_tensor(codes), paddle.to_tensor(np.ones(1, np.float32)), k, 1, -1,
                            "bfloat16")
    one = np.float32(1.0)
    ulp = np.float32(2.0**-7)  # bf16's spacing at 1
    cases = [one + ulp / 2, one + ulp * 1.5, one + ulp / 2 + np.float32(2.0**-20), np.float32(1e-40),
             -(one + ulp / 2)]
    want = [one, one + 2 * ulp, one + ulp, 0.0, -one]
    for value, expected in zip(cases, want):
        x = np.zeros((1, k), np.float32)
        x[0, 5] = value
        assert _run(x, quant)[0, 0] == np.float32(expected), (value, expected)


def test_integer_activations_give_the_fp32_kernels_bits() -> None:
    """Small integers and power-of-two scales are exact either way: method 10 equals methods 0 and 3."""
    rng = np.random.default_rng(3)
    n, k = 40, 64
    scales = np.ldexp(np.ones(n, np.float32), rng.integers(-3, 3, n)).astype(np.float32)
    quant, _ = _weight(rng, n, k, scales=scales)
    x = rng.integers(-16, 17, (9, k)).astype(np.float32)
    np.testing.assert_array_equal(_run(x, quant), _run(x, quant, PACKED_FP32))
    np.testing.assert_array_equal(_run(x, quant), _run(x, quant, CONTRACT_FP32))


def test_an_odd_k_is_refused_by_name() -> None:
    from fd_x86.build import load_ops
    from fd_x86.linear import quantized_linear, wint8_bf16

    rng = np.random.default_rng(5)
    quant, deq = _weight(rng, 16, 13)
    x = rng.normal(0, 1, (2, 13)).astype(np.float32)
    w = paddle.to_tensor(np.zeros(32 * 13, np.int8))
    with pytest.raises(Exception, match="method 10 .wint8 pairs. needs an even K, got 13"):
        load_ops().fd_x86_packed_linear(paddle.to_tensor(x), w, quant.scales, BF16_METHOD, 16, -1, 1)
    assert not wint8_bf16(quant)  # quantized_linear keeps the fp32 kernels
    np.testing.assert_allclose(quantized_linear(paddle.to_tensor(x), quant).numpy(), x @ deq.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 9])  # 9: past wint8's packed-kernel rows (7), where the contract one ran
def test_quantized_linear_takes_it_for_bf16_activations(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_x86.linear import quantized_linear

    rng = np.random.default_rng(4)
    quant, _ = _weight(rng, 48, 128)
    fp32_model, _ = _weight(np.random.default_rng(4), 48, 128, act_dtype="float32")
    x = rng.normal(0, 1, (rows, 128)).astype(np.float32)
    fp32 = PACKED_FP32 if rows <= 7 else CONTRACT_FP32
    bf16_out, fp32_out = _run(x, quant), _run(x, quant, fp32)
    np.testing.assert_array_equal(quantized_linear(paddle.to_tensor(x), quant).numpy(), bf16_out)
    np.testing.assert_array_equal(quantized_linear(paddle.to_tensor(x), fp32_model).numpy(), fp32_out)
    monkeypatch.setenv("FD_X86_INT8_BF16", "0")  # the switch: the fp32 kernels
    np.testing.assert_array_equal(quantized_linear(paddle.to_tensor(x), quant).numpy(), fp32_out)
    monkeypatch.delenv("FD_X86_INT8_BF16")
    np.testing.assert_array_equal(quantized_linear(paddle.to_tensor(x), quant).numpy(), bf16_out)


# ------------------------------------------------------------ the fused run


@pytest.mark.parametrize("act_dtype,method", [("bfloat16", BF16_METHOD), ("float32", PACKED_FP32)])
def test_the_fused_run_picks_the_kernel_fd_linear_picks(x86_ops: Any, act_dtype: str, method: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    FusedCase(x86_ops, decoder_layer("wint8", act_dtype)).check(method, "FD_X86_INT8_BF16", PACKED_FP32, monkeypatch)


# ------------------------------------------------------------ routed and shared experts

E, D, INTER = 8, 256, 96  # up_gate K = 256, down K = 96: multiples of 32


def _ffn(x: np.ndarray, up: np.ndarray, down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """down(silu(gate) * up) with both linears' inputs rounded to bf16 (float64 otherwise), and the
    room one activation's rounding may take per output: the kernel's fp32 gate and up may land on the
    other side of a bf16 rounding boundary than float64's, moving an activation by one bf16 ulp
    (2^-8 of it at most), so each output may move by that much of its largest term."""
    h = _bf16(x.astype(np.float32)).astype(np.float64) @ up
    gate, upv = h[:, :h.shape[1] // 2], h[:, h.shape[1] // 2:]
    act = _bf16((gate / (1 + np.exp(-gate)) * upv).astype(np.float32)).astype(np.float64)
    flip = 2.0**-8 * np.max(np.abs(act)[:, :, None] * np.abs(down)[None], axis=1)
    return act @ down, flip


def _deq(q: QuantizedWeight) -> np.ndarray:
    """A wint8 weight's values ``[..., in, out]`` in float64."""
    return np.swapaxes(q.qweight.numpy().astype(np.float64) * q.scales.numpy().astype(np.float64)[..., None], -1, -2)


def _experts(seed: int, act_dtype: str, d: int = D, inter: int = INTER) -> tuple[QuantizedWeight, QuantizedWeight]:
    rng = np.random.default_rng(seed)

    def stack(d_in: int, d_out: int) -> QuantizedWeight:
        codes = rng.integers(-128, 128, (E, d_out, d_in)).astype(np.int8)  # -128 too (the table conversion)
        scales = (rng.random((E, d_out)) * 0.002 + 0.0002).astype(np.float32)
        return QuantizedWeight("wint8", paddle.to_tensor(codes), paddle.to_tensor(scales), d_in, d_out, -1, act_dtype)

    return stack(d, 2 * inter), stack(inter, d)


def _shared_expert(seed: int, act_dtype: str) -> tuple[QuantizedWeight, QuantizedWeight]:
    up, down = _experts(seed, act_dtype)
    return up.expert(0), down.expert(0)


def _routing(rng: np.random.Generator, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.stack([rng.permutation(E)[:2] for _ in range(tokens)]).astype(np.int64)
    return ids, rng.random((tokens, 2)).astype(np.float32)


@pytest.mark.parametrize("tokens", [1, 3, 33])  # 1 and 3: the few-token region; 33 the per-expert loop (and the
# shared expert's 33 rows: its panel)
def test_routed_and_shared_experts_on_bf16_activations(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import fd_x86.moe

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(tokens)
    quant, shared = _experts(tokens, "bfloat16"), _shared_expert(tokens + 100, "bfloat16")
    x = rng.standard_normal((tokens, D)).astype(np.float32)
    ids, weights = _routing(rng, tokens)
    up, down = _deq(quant[0]), _deq(quant[1])
    want, room = np.zeros((tokens, D)), np.zeros((tokens, D))
    for t in range(tokens):
        for j in range(2):
            out, flip = _ffn(x[t:t + 1], up[ids[t, j]], down[ids[t, j]])
            want[t] += weights[t, j] * out[0]
            room[t] += weights[t, j] * flip[0]
    args = (paddle.to_tensor(x), paddle.to_tensor(weights), paddle.to_tensor(ids))
    routed = fd_x86.moe.moe_experts(*args, quant).numpy()
    tol = 1e-5 * np.abs(want) + 1e-6 * np.abs(want).max() + room
    assert np.all(np.abs(routed - want) <= tol), np.abs(routed - want).max()
    both = fd_x86.moe.moe_layer_experts(*args, quant, *shared).numpy()
    out, flip = _ffn(x, _deq(shared[0]), _deq(shared[1]))
    want, room = want + out, room + flip
    tol = 1e-5 * np.abs(want) + 1e-6 * np.abs(want).max() + room
    assert np.all(np.abs(both - want) <= tol), np.abs(both - want).max()
    # the switch, or float32 activations: wint8's fp32 kernels, which differ by the rounding
    monkeypatch.setenv("FD_X86_INT8_BF16", "0")
    off = fd_x86.moe.moe_experts(*args, quant).numpy()
    monkeypatch.delenv("FD_X86_INT8_BF16")
    plain = fd_x86.moe.moe_experts(*args, _experts(tokens, "float32")).numpy()
    np.testing.assert_array_equal(off, plain)
    assert np.abs(off - routed).max() > 1e-4 * np.abs(want).max()


def test_an_experts_bits_do_not_depend_on_its_token_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every token through experts 2 and 5: 1 token, 3 (the few-token region's channel slices) and 40
    (the per-expert loop, its panel) give each token the same bits."""
    import fd_x86.moe

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(21)
    quant = _experts(21, "bfloat16")
    x = rng.standard_normal((40, D)).astype(np.float32)
    ids = np.tile(np.array([[2, 5]], np.int64), (40, 1))
    weights = np.tile(np.array([[0.75, 0.25]], np.float32), (40, 1))

    def run(rows: slice) -> np.ndarray:
        return fd_x86.moe.moe_experts(paddle.to_tensor(x[rows]), paddle.to_tensor(weights[rows]),
                                      paddle.to_tensor(ids[rows]), quant).numpy()

    full = run(slice(0, 40))
    np.testing.assert_array_equal(run(slice(0, 3)), full[:3])
    for t in (0, 17, 39):
        np.testing.assert_array_equal(run(slice(t, t + 1)), full[t:t + 1])


def test_experts_the_bf16_kernel_cannot_take_run_wint8s(monkeypatch: pytest.MonkeyPatch) -> None:
    """K not a multiple of 32 (hidden 200, width 100): the op runs wint8's kernels on the fp32 activations."""
    import fd_x86.moe

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(11)
    x = paddle.to_tensor(rng.standard_normal((3, 200)).astype(np.float32))
    ids = paddle.to_tensor(np.array([[0, 5], [5, 2], [7, 1]], np.int64))
    weights = paddle.to_tensor(rng.random((3, 2)).astype(np.float32))
    bf16 = fd_x86.moe.moe_experts(x, weights, ids, _experts(1, "bfloat16", d=200, inter=100)).numpy()
    fp32 = fd_x86.moe.moe_experts(x, weights, ids, _experts(1, "float32", d=200, inter=100)).numpy()
    np.testing.assert_array_equal(bf16, fp32)


def test_the_opt_in_int8_activations_come_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """``FD_X86_PREFILL_INT8_ACT=1`` at 32+ rows: a bf16 model's wint8 linear and experts take the
    int8-activation kernels (the same bits as a float32 model's there), not the bf16 ones."""
    import fd_x86.moe
    from fd_x86.linear import quantized_linear

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    monkeypatch.setenv("FD_X86_PREFILL_INT8_ACT", "1")
    rng = np.random.default_rng(31)
    quant, _ = _weight(rng, 48, 128)
    x = rng.normal(0, 1, (32, 128)).astype(np.float32)
    np.testing.assert_array_equal(quantized_linear(paddle.to_tensor(x), quant).numpy(), _run(x, quant, INT8_ACT))
    # the whole-layer op (the one that takes the opt-in), routed and shared experts, 33 tokens
    xe = paddle.to_tensor(rng.standard_normal((33, D)).astype(np.float32))
    gate = paddle.to_tensor(rng.standard_normal((D, E)).astype(np.float32))

    def layer(act_dtype: str) -> np.ndarray:
        out = fd_x86.moe.moe_layer(xe, gate, None, 2, True, 1e-12, _experts(5, act_dtype),
                                   *_shared_expert(6, act_dtype))
        assert out is not None
        return out.numpy()

    bf16 = layer("bfloat16")
    np.testing.assert_array_equal(bf16, layer("float32"))
    monkeypatch.delenv("FD_X86_PREFILL_INT8_ACT")  # without it the two models' kernels differ
    assert not np.array_equal(layer("bfloat16"), layer("float32"))


def test_the_moe_layer_entry_follows_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-layer op's cached entry (``fd_x86.moe._entry``) names code 7 for a bf16 model's wint8
    experts and shared expert, and 0 once ``FD_X86_INT8_BF16=0``: the switch is part of its validity."""
    import fd_x86.moe

    quant, shared = _experts(41, "bfloat16"), _shared_expert(42, "bfloat16")
    gate = paddle.to_tensor(np.random.default_rng(43).standard_normal((D, E)).astype(np.float32))
    attrs = fd_x86.moe._entry(gate, None, quant, *shared)[1]
    assert (attrs[0], attrs[4]) == (7, 7)
    monkeypatch.setenv("FD_X86_INT8_BF16", "0")
    attrs = fd_x86.moe._entry(gate, None, quant, *shared)[1]
    assert (attrs[0], attrs[4]) == (0, 0)


_TABLES_SCRIPT = """
import sys
import numpy as np
import paddle
sys.path.insert(0, {tests!r})
import test_x86_int8_bf16 as t
import fd_x86.moe
rng = np.random.default_rng(77)
quant, _ = t._weight(rng, 70, 192)
outs = {{f"pairs{{rows}}": t._run(rng.normal(0, 1, (rows, 192)).astype(np.float32), quant)
        for rows in (1, 2, 3, 4, 5, 70)}}
experts = t._experts(78, "bfloat16")
for tokens in (1, 3, 40):
    x = rng.standard_normal((tokens, t.D)).astype(np.float32)
    ids, weights = t._routing(rng, tokens)
    outs[f"experts{{tokens}}"] = fd_x86.moe.moe_experts(paddle.to_tensor(x), paddle.to_tensor(weights),
                                                       paddle.to_tensor(ids), experts).numpy()
np.savez(sys.argv[1], **outs)
"""


def test_the_byte_tables_give_the_widening_conversions_bits(tmp_path: Any) -> None:
    """Where the CPU has AVX-512 VBMI the kernels convert codes by byte tables (kernels_int8_bf16.cc's
    CodeTables) in tiles of up to 4 rows, and the panels; ``FD_X86_INT8_BF16_TABLES=0`` (read once per
    process) widens them through fp32 instead. The linears at 1-5 and 70 rows and the experts at 1, 3 and
    40 tokens must give the same bits both ways (a CPU without VBMI runs the widening both times). Whether the
    switch is read is not checked here (no op reports the path taken); the tables' own values are checked
    against float64 above, -128 included."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "tables.py"
    script.write_text(_TABLES_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = {k: v for k, v in os.environ.items() if k not in ("FD_X86_INT8_BF16_TABLES", "FD_X86_MOE_NATIVE")}
    got = {}
    for tables in ("1", "0"):
        out = tmp_path / f"out{tables}.npz"
        done = subprocess.run([sys.executable, str(script), str(out)], env={**env, "FD_X86_INT8_BF16_TABLES": tables},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        got[tables] = dict(np.load(out))
    assert sorted(got["1"]) == sorted(got["0"])
    for name, value in got["1"].items():
        np.testing.assert_array_equal(value, got["0"][name], err_msg=name)
