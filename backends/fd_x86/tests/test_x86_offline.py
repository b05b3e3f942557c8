"""The offline checkpoints' expert formats on the native kernels
(``fd_x86.offline``, ``csrc/kernels_offline_avx512.cc``): ``w4a8_static``
(W4A8C8) and ``wint2`` (2Bits) against the numpy decodings of
``fd_core.quantization.w4a8`` / ``wint2``, one matrix and the MoE ops."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build

paddle = pytest.importorskip("paddle")

import fd_x86.moe  # noqa: E402
import fd_x86.offline  # noqa: E402

from fd_core.ops.linear import QuantizedWeight  # noqa: E402
from fd_core.quantization.wint import quantize_int4  # noqa: E402
from fd_core.quantization.wint2 import decode_wint2, pack_scales  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    if not fd_x86.offline.available():
        pytest.skip("the offline formats' kernels need AVX-512 VNNI")
    build.load_ops()


# ------------------------------------------------------------------ weights

def _wint2_parts(rng: np.random.Generator, d_in: int, d_out: int) -> tuple[np.ndarray, ...]:
    """FastDeploy's five tensors with random codes: any byte, any nibble, code
    zero points of both signs (negative codes: the arithmetic shift)."""
    qw = rng.integers(0, 256, (d_in // 4, d_out), dtype=np.uint8)
    ws = rng.integers(0, 256, (d_in // 128, d_out), dtype=np.uint8)
    sup = (rng.uniform(0.5, 1.5, d_out) * 0.05 / (15 * 31)).astype(np.float32)
    cs = rng.uniform(60.0, 128.0, d_out).astype(np.float32)
    zp = rng.uniform(-300.0, 300.0, d_out).astype(np.float32)
    return qw, ws, sup, cs, zp


def _wint2(rng: np.random.Generator, d_in: int, d_out: int) -> tuple[QuantizedWeight, np.ndarray]:
    qw, ws, sup, cs, zp = _wint2_parts(rng, d_in, d_out)
    quant = QuantizedWeight("wint2", paddle.to_tensor(qw), paddle.to_tensor(pack_scales(ws, sup, cs, zp)),
                            d_in, d_out, 64)
    return quant, decode_wint2(qw, ws, sup, cs, zp)


def _w4a8s_parts(rng: np.random.Generator, d_in: int, d_out: int, amax: float) -> tuple[np.ndarray, np.ndarray]:
    packed, w_scale = quantize_int4(rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32), group_size=-1)
    scales = np.stack([w_scale[:, 0], np.full(d_out, amax, np.float32)], axis=1).astype(np.float32)
    return packed, scales


def _w4a8s_want(x: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The reference's numerics with exact integer dot products (float64)."""
    amax = np.float32(scales[0, 1])
    xq = np.clip(np.rint(x.astype(np.float32) * (np.float32(127.0) / amax)), -127, 127).astype(np.int64)
    lo = (packed & 0x0F).astype(np.int64)
    hi = (packed >> 4).astype(np.int64)
    codes = np.empty((packed.shape[0], 2 * packed.shape[1]), np.int64)
    codes[:, 0::2] = np.where(lo > 7, lo - 16, lo)
    codes[:, 1::2] = np.where(hi > 7, hi - 16, hi)
    dots = xq @ codes.T  # [M, N], exact
    return dots.astype(np.float64) * scales[:, 0].astype(np.float64) * (float(amax) / 127.0)


# ------------------------------------------------------------------ one matrix

def _linear(x: np.ndarray, quant: QuantizedWeight) -> np.ndarray:
    out = backend.fd_linear(paddle.to_tensor(x), None, None, quant)
    assert out is not None  # the native op answered
    return np.asarray(out.numpy())


@pytest.mark.parametrize("tokens,d_in,d_out", [(1, 128, 64), (2, 256, 130), (4, 384, 40), (9, 256, 130),
                                               (37, 384, 257)])
def test_wint2_linear_matches_the_decoding(tokens: int, d_in: int, d_out: int) -> None:
    """Register path (<= 4 rows) and panel path (more), partial channel blocks."""
    rng = np.random.default_rng(tokens * 1000 + d_out)
    quant, w = _wint2(rng, d_in, d_out)
    x = rng.standard_normal((tokens, d_in)).astype(np.float32)
    got = _linear(x, quant)
    want = x.astype(np.float64) @ w.astype(np.float64)
    bound = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
    assert np.all(np.abs(got - want) <= 1e-6 * bound + 1e-30)


@pytest.mark.parametrize("rows", [1, 3, 128])
def test_wint2_weights_are_decoded_exactly(rows: int) -> None:
    """One-hot rows read single weights back: every decoded weight equals the
    reference's bit for bit (the code's fp32 steps, the floor, the windows)."""
    rng = np.random.default_rng(rows)
    quant, w = _wint2(rng, 128, 48)
    ks = rng.permutation(128)[:rows]
    x = np.zeros((rows, 128), np.float32)
    x[np.arange(rows), ks] = 1.0
    got = _linear(x, quant)
    np.testing.assert_array_equal(got, w[ks])


@pytest.mark.parametrize("tokens,d_in,d_out", [(1, 128, 64), (3, 200, 130), (9, 256, 130), (37, 384, 257)])
def test_w4a8_static_linear_matches_the_exact_integer_form(tokens: int, d_in: int, d_out: int) -> None:
    """Static activation codes (some clipped, a zero token, K/2 not a multiple of 64)."""
    rng = np.random.default_rng(tokens * 7 + d_in)
    packed, scales = _w4a8s_parts(rng, d_in, d_out, 3.0)
    x = rng.standard_normal((tokens, d_in)).astype(np.float32)
    x[0, :8] *= 6.0
    if tokens > 2:
        x[2] = 0.0
    quant = QuantizedWeight("w4a8_static", paddle.to_tensor(packed), paddle.to_tensor(scales), d_in, d_out, -1)
    got = _linear(x, quant)
    want = _w4a8s_want(x, packed, scales)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * float(np.abs(want).max()))


def test_offline_methods_are_declared_and_refused_on_other_shapes() -> None:
    methods = backend.fd_device_capabilities().quantization_methods
    assert "wint2" in methods and "w4a8_static" in methods
    ops = build.load_ops()
    x = paddle.ones([1, 100])
    with pytest.raises(Exception, match="multiple of 128"):
        ops.fd_x86_offline_linear(x, paddle.zeros([25, 8], dtype="uint8"), paddle.zeros([8 * 4]), 4, 1)


# ------------------------------------------------------------------ routed experts

E, D, INTER = 8, 256, 128


def _stacked(method: str, rng: np.random.Generator) -> tuple[QuantizedWeight, QuantizedWeight]:
    def stack(d_in: int, d_out: int, amax: float) -> QuantizedWeight:
        if method == "wint2":
            parts = [(p[0], pack_scales(*p[1:])) for p in (_wint2_parts(rng, d_in, d_out) for _ in range(E))]
        else:  # a different static activation max per expert
            parts = [_w4a8s_parts(rng, d_in, d_out, amax * (1 + 0.1 * e)) for e in range(E)]
        return QuantizedWeight(method, paddle.to_tensor(np.stack([p[0] for p in parts])),
                               paddle.to_tensor(np.stack([p[1] for p in parts])), d_in, d_out,
                               64 if method == "wint2" else -1)

    return stack(D, 2 * INTER, 3.0), stack(INTER, D, 0.5)


def _routing(rng: np.random.Generator, tokens: int, top_k: int) -> tuple[Any, Any]:
    ids = np.stack([rng.permutation(E)[:top_k] for _ in range(tokens)]).astype(np.int64)
    return paddle.to_tensor(rng.random((tokens, top_k)).astype(np.float32)), paddle.to_tensor(ids)


@pytest.mark.parametrize("method", ["w4a8_static", "wint2"])
@pytest.mark.parametrize("tokens,top_k", [(1, 4), (3, 2), (8, 4), (33, 8)])
def test_native_experts_match_the_reference(method: str, tokens: int, top_k: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_core.quantization.reference import quantized_moe_experts

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(tokens + 100 * top_k)
    quant = _stacked(method, rng)
    x = paddle.to_tensor(rng.standard_normal((tokens, D)).astype(np.float32))
    weights, ids = _routing(rng, tokens, top_k)
    want = quantized_moe_experts(x, weights, ids, quant).numpy()
    got = fd_x86.moe.moe_experts(x, weights, ids, quant)
    assert got is not None
    # w4a8_static: an ulp of silu may move one static int8 step of the down input
    atol = (2e-3 if method == "w4a8_static" else 1e-5) * float(np.abs(want).max())
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("method", ["w4a8_static", "wint2"])
def test_layer_op_runs_offline_experts_with_a_wint8_shared_expert(method: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-layer op (router, routing, offline experts, the wint8 shared
    expert of these checkpoints) equals the reference's composition."""
    from fd_core.backends import get_backend
    from fd_core.quantization.weights import quantize_weight

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    monkeypatch.delenv("FD_X86_MOE_LAYER", raising=False)
    rng = np.random.default_rng(5)
    quant = _stacked(method, rng)
    args = dict(gate=paddle.to_tensor(rng.standard_normal((D, E)).astype(np.float32) * 0.1),
                correction_bias=paddle.to_tensor(rng.normal(0, 0.05, E).astype(np.float32)), top_k=2,
                renormalize=True, norm_min=1e-12, up_gate_weights=None, down_weights=None, quant=quant,
                shared_up_gate=quantize_weight("wint8", paddle.to_tensor(
                    rng.standard_normal((D, 2 * INTER)).astype(np.float32) * 0.05)),
                shared_down=quantize_weight("wint8", paddle.to_tensor(
                    rng.standard_normal((INTER, D)).astype(np.float32) * 0.05)))
    x = paddle.to_tensor(rng.standard_normal((5, D)).astype(np.float32))
    got = backend.fd_moe_layer(x, **args)
    assert got is not None
    want = get_backend("cpu").ops.moe_layer(x, **args).numpy()
    atol = (2e-3 if method == "w4a8_static" else 1e-5) * float(np.abs(want).max())
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=atol)


def test_offline_experts_are_left_to_the_reference_when_the_op_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """FD_X86_MOE_NATIVE=0: the per-expert path has contract-layout kernels only."""
    monkeypatch.setenv("FD_X86_MOE_NATIVE", "0")
    rng = np.random.default_rng(0)
    quant = _stacked("wint2", rng)
    x = paddle.to_tensor(rng.standard_normal((2, D)).astype(np.float32))
    weights, ids = _routing(rng, 2, 2)
    assert fd_x86.moe.moe_experts(x, weights, ids, quant) is None


# ------------------------------------------------------------------ checkpoints end to end

@pytest.mark.parametrize("fmt,overrides", [("w4a8c8", {}), ("2bits", {"hidden_size": 128, "moe_intermediate_size": 128})])
def test_offline_checkpoint_greedy_tokens_equal_the_reference(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                              fmt: str, overrides: dict[str, Any]) -> None:
    """The generated W4A8C8 / 2Bits tiny MoE checkpoints (2Bits: wint4 experts
    in the first MoE layer, wint2 after) decode the same greedy tokens on x86
    as on the reference, every MoE layer through the native layer op."""
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.testing.greedy import greedy_generate
    from fd_core.testing.quantized_checkpoints import generate_offline_checkpoint

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    monkeypatch.delenv("FD_X86_MOE_LAYER", raising=False)
    _, ck = generate_offline_checkpoint(tmp_path / fmt, fmt, "tiny-moe", seed=1, **overrides)
    answered: list[str] = []
    real = fd_x86.moe.moe_layer

    def counted(x: Any, gate: Any, bias: Any, top_k: int, renorm: bool, norm_min: float, quant: Any,
                *shared: Any) -> Any:
        out = real(x, gate, bias, top_k, renorm, norm_min, quant, *shared)
        answered.append(quant[0].method if out is not None else "none")
        return out

    monkeypatch.setattr(fd_x86.moe, "moe_layer", counted)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(100, 1000, n)] for n in (5, 19)]

    def run(name: str) -> tuple[list[list[int]], list[list[float]]]:
        runner = ModelRunner(ck, get_backend(name), num_blocks=24, block_size=16)
        return greedy_generate(runner, prompts, 8, chunk_size=8)

    want_tokens, want_logprobs = run("cpu")
    got_tokens, got_logprobs = run("x86")
    expected = {"w4a8_static"} if fmt == "w4a8c8" else {"wint4", "wint2"}
    assert answered and set(answered) == expected, answered
    assert got_tokens == want_tokens
    worst = max(abs(g - w) for gs, ws in zip(got_logprobs, want_logprobs) for g, w in zip(gs, ws))
    assert worst < 5e-3, worst
