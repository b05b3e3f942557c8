"""Quantized routed experts on the native kernels (fd_x86.moe): the hook's
routing, and a tiny MoE model end to end against the reference numerics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build

paddle = pytest.importorskip("paddle")

import fd_x86.moe  # noqa: E402

from fd_core.backends import get_backend  # noqa: E402
from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.ops.linear import QuantizedWeight  # noqa: E402
from fd_core.quantization.config import parse_quantization  # noqa: E402
from fd_core.quantization.weights import quantize_array  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402
from fd_core.testing.greedy import greedy_generate  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    build.load_ops()


def test_unquantized_experts_are_left_to_the_reference() -> None:
    x = paddle.ones([2, 8])
    assert backend.fd_moe_experts(x, x, x, None, None, None) is None


@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
def test_tiny_moe_model_quantized_matches_the_reference_numerics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Greedy decoding of the tiny MoE model with ``method`` (wint4: experts
    wint4, the rest wint8, FastDeploy's rule): the whole-layer op (router,
    routing, routed + shared experts, one call per layer) answers every MoE
    call, and tokens and logprobs follow the reference's numerics."""
    answered = []
    real = fd_x86.moe.moe_experts

    def counted(*args):  # type: ignore[no-untyped-def]
        out = real(*args)
        answered.append(out is not None)
        return out

    monkeypatch.setattr(fd_x86.moe, "moe_experts", counted)
    layered = []
    real_layer = fd_x86.moe.moe_layer_experts

    def counted_layer(*args):  # type: ignore[no-untyped-def]
        out = real_layer(*args)
        layered.append(out is not None)
        return out

    # the tiny MoE has a shared expert: its layers ask fd_moe_layer_experts first
    monkeypatch.setattr(fd_x86.moe, "moe_layer_experts", counted_layer)
    routed = []
    real_select = fd_x86.moe.select_experts

    def counted_select(*args):  # type: ignore[no-untyped-def]
        out = real_select(*args)
        routed.append(out is not None)
        return out

    monkeypatch.setattr(fd_x86.moe, "select_experts", counted_select)
    whole = []
    real_whole = fd_x86.moe.moe_layer

    def counted_whole(*args):  # type: ignore[no-untyped-def]
        out = real_whole(*args)
        whole.append(out is not None)
        return out

    # its MoE layers ask fd_moe_layer (router, routing, experts, shared expert) first
    monkeypatch.setattr(fd_x86.moe, "moe_layer", counted_whole)
    model = generate_checkpoint(tmp_path / "moe", "tiny-moe", naming="paddle", seed=7, dtype="float32")
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(100, 1000, n)] for n in (4, 21)]

    def run(name: str) -> tuple[list[list[int]], list[list[float]]]:
        quantization = parse_quantization(method, "Ernie4_5_MoeForCausalLM")
        runner = ModelRunner(model, get_backend(name), num_blocks=24, block_size=16, quantization=quantization)
        return greedy_generate(runner, prompts, 8, chunk_size=8)

    want_tokens, want_logprobs = run("cpu")
    got_tokens, got_logprobs = run("x86")
    assert whole and all(whole) and not layered and not answered and not routed
    assert got_tokens == want_tokens
    worst = max(abs(g - w) for gs, ws in zip(got_logprobs, want_logprobs) for g, w in zip(gs, ws))
    assert worst < 1e-3, worst


# ---------------------------------------------------------------- the native ops

# experts, hidden, expert width: wint4 groups of 128 take the lookup-table kernel (2 groups on
# up_gate, 1 on down); groups of 64 the contract-layout kernel
E, D, INTER = 8, 256, 128


def _stacked(method: str, rng: np.random.Generator, group: int = 128) -> tuple[QuantizedWeight, QuantizedWeight]:
    """(up_gate, down) QuantizedWeights stacked over E experts, as the loader makes them."""

    def stack(d_in: int, d_out: int) -> QuantizedWeight:
        parts = [quantize_array(method, rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05, group)
                 for _ in range(E)]
        return QuantizedWeight(method, paddle.to_tensor(np.stack([p[0] for p in parts])),
                               paddle.to_tensor(np.stack([p[1] for p in parts])), d_in, d_out, parts[0][2])

    return stack(D, 2 * INTER), stack(INTER, D)


def _routing(rng: np.random.Generator, tokens: int, top_k: int) -> tuple[Any, Any]:
    ids = np.stack([rng.permutation(E)[:top_k] for _ in range(tokens)]).astype(np.int64)
    weights = rng.random((tokens, top_k)).astype(np.float32)
    return paddle.to_tensor(weights), paddle.to_tensor(ids)


def _check_experts(method: str, x: Any, weights: Any, ids: Any, quant: tuple[QuantizedWeight, QuantizedWeight],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    from fd_core.quantization.reference import quantized_moe_experts

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    want = quantized_moe_experts(x, weights, ids, quant).numpy()
    got = fd_x86.moe.moe_experts(x, weights, ids, quant).numpy()
    # w8a8: the down input is quantized per token, so an ulp in silu may move one int8 step
    atol = (2e-3 if method == "w8a8" else 1e-5) * float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
@pytest.mark.parametrize("tokens", [1, 3, 8, 33])
@pytest.mark.parametrize("top_k", [1, 2, 4, 8])
def test_native_experts_match_the_reference(method: str, tokens: int, top_k: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """One op call equals the reference's grouped experts, experts with no
    tokens (at T = 1 most of them) included."""
    rng = np.random.default_rng(tokens * 10 + top_k)
    quant = _stacked(method, rng)
    x = paddle.to_tensor(rng.standard_normal((tokens, D)).astype(np.float32))
    weights, ids = _routing(rng, tokens, top_k)
    _check_experts(method, x, weights, ids, quant, monkeypatch)


@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_native_wint4_with_groups_the_table_kernel_does_not_take(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of 64 (not a multiple of the 128-input block): the contract-layout kernel, same results."""
    rng = np.random.default_rng(tokens)
    quant = _stacked("wint4", rng, 64)
    x = paddle.to_tensor(rng.standard_normal((tokens, D)).astype(np.float32))
    weights, ids = _routing(rng, tokens, 4)
    _check_experts("wint4", x, weights, ids, quant, monkeypatch)


@pytest.mark.parametrize("method, group", [("wint8", 128), ("wint4", 128), ("wint4", 64), ("wint4", -1),
                                           ("w8a8", 128)])
def test_native_experts_all_tokens_to_one_expert(method: str, group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    quant = _stacked(method, rng, group)
    x = paddle.to_tensor(rng.standard_normal((33, D)).astype(np.float32))
    ids = paddle.full([33, 1], 5, dtype="int64")
    weights = paddle.to_tensor(rng.random((33, 1)).astype(np.float32))
    _check_experts(method, x, weights, ids, quant, monkeypatch)


def test_native_experts_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """FD_X86_MOE_NATIVE=0: the per-expert path answers (same numbers), the op is not called."""
    rng = np.random.default_rng(2)
    quant = _stacked("wint8", rng)
    x = paddle.to_tensor(rng.standard_normal((3, D)).astype(np.float32))
    weights, ids = _routing(rng, 3, 2)
    native = fd_x86.moe.moe_experts(x, weights, ids, quant).numpy()
    monkeypatch.setenv("FD_X86_MOE_NATIVE", "0")
    monkeypatch.setattr(fd_x86.moe, "_native_experts", None)  # called: TypeError
    np.testing.assert_allclose(fd_x86.moe.moe_experts(x, weights, ids, quant).numpy(), native,
                               rtol=1e-5, atol=1e-6)
    assert backend.fd_moe_select_experts(paddle.ones([2, E]), 2, None, True, 1e-12) is None


def test_native_experts_refuse_bad_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(3)
    quant = _stacked("wint8", rng)
    x = paddle.to_tensor(rng.standard_normal((2, D)).astype(np.float32))
    ids = paddle.to_tensor(np.array([[0], [E]], dtype=np.int64))
    with pytest.raises(Exception, match="outside"):
        fd_x86.moe.moe_experts(x, paddle.ones([2, 1]), ids, quant)


@pytest.mark.parametrize("tokens", [1, 8, 33])
@pytest.mark.parametrize("top_k", [1, 2, 4, 8])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("renormalize, norm_min", [(True, 1e-12), (True, 2.0), (False, 1e-12)])
def test_native_routing_matches_the_reference(tokens: int, top_k: int, bias: bool, renormalize: bool,
                                              norm_min: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Selection by probs + correction bias, weights from probs, renormalised
    with norm_min (2.0 > any sum: the clip decides): the reference's ids and weights."""
    from fd_core.ops.moe import reference_moe_select_experts

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(tokens + top_k)
    logits = paddle.to_tensor(rng.standard_normal((tokens, E)).astype(np.float32) * 2)
    correction = paddle.to_tensor(rng.standard_normal(E).astype(np.float32) * 0.1) if bias else None
    want_w, want_ids = reference_moe_select_experts(logits, top_k, correction, renormalize, norm_min)
    got = backend.fd_moe_select_experts(logits, top_k, correction, renormalize, norm_min)
    assert got is not None
    got_w, got_ids = got
    assert str(got_ids.dtype) == "paddle.int64" and got_ids.shape == [tokens, top_k]
    np.testing.assert_array_equal(got_ids.numpy(), want_ids.numpy())
    np.testing.assert_allclose(got_w.numpy(), want_w.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
def test_native_experts_avx2_kernels_match_the_reference(method: str) -> None:
    """The op's AVX2 kernels (isa=1: CPUs without AVX-512), on two threads."""
    from fd_x86.cpu import cpu_features

    from fd_core.quantization.reference import quantized_moe_experts

    if not cpu_features().has("avx2", "fma"):
        pytest.skip("this CPU has no AVX2")
    rng = np.random.default_rng(4)
    up, down = _stacked(method, rng)
    x = paddle.to_tensor(rng.standard_normal((5, D)).astype(np.float32))
    weights, ids = _routing(rng, 5, 2)
    want = quantized_moe_experts(x, weights, ids, (up, down)).numpy()
    got = build.load_ops().fd_x86_moe_experts(
        x, ids, weights, up.qweight, up.scales, down.qweight, down.scales, {"wint8": 0, "wint4": 1, "w8a8": 2}[method],
        up.group_size, down.group_size, 1, 2).numpy()
    atol = (2e-3 if method == "w8a8" else 1e-5) * float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)


# ---------------------------------------------------------------- routed + shared expert in one call

SHARED = 256  # the shared expert's width: not the routed experts' (2 wint4 groups on down)


def _shared(method: str, rng: np.random.Generator, group: int = 128) -> tuple[QuantizedWeight, QuantizedWeight]:
    """(up_gate [D, 2*SHARED], down [SHARED, D]) 2-D QuantizedWeights, as a quantized GatedMLP holds them."""

    def one(d_in: int, d_out: int) -> QuantizedWeight:
        q, scales, g = quantize_array(method, rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05, group)
        return QuantizedWeight(method, paddle.to_tensor(q), paddle.to_tensor(scales), d_in, d_out, g)

    return one(D, 2 * SHARED), one(SHARED, D)


def _composed(x: Any, weights: Any, ids: Any, quant: Any, shared: Any) -> Any:
    """What MoE layers computed before: the x86 routed experts, then the shared GatedMLP through the x86 ops."""
    ops = get_backend("x86").ops
    s_up, s_down = shared
    routed = ops.moe_experts(x, weights, ids, None, None, quant)
    return routed + ops.linear(ops.silu_and_mul(ops.linear(x, None, None, s_up)), None, None, s_down)


@pytest.mark.parametrize("method, shared_method", [("wint8", "wint8"), ("wint4", "wint4"), ("w8a8", "w8a8"),
                                                   ("wint4", "wint8")])
@pytest.mark.parametrize("tokens, top_k", [(1, 2), (8, 4), (33, 1)])
def test_routed_and_shared_experts_in_one_call_equal_the_composed_ops(
    method: str, shared_method: str, tokens: int, top_k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Ops.moe_experts_with_shared`` on x86 is answered by the one native op
    (wint4 experts with a wint8 shared expert too: FastDeploy's wint4 rule)
    and equals moe_experts + the shared GatedMLP through the x86 ops."""
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(tokens * 10 + top_k)
    quant, shared = _stacked(method, rng), _shared(shared_method, rng)
    x = paddle.to_tensor(rng.standard_normal((tokens, D)).astype(np.float32))
    weights, ids = _routing(rng, tokens, top_k)
    fused = fd_x86.moe.moe_layer_experts(x, weights, ids, quant, *shared)
    assert fused is not None
    got = get_backend("x86").ops.moe_experts_with_shared(x, weights, ids, None, None, quant, *shared).numpy()
    want = _composed(x, weights, ids, quant, shared).numpy()
    np.testing.assert_array_equal(fused.numpy(), got)
    # w8a8: the down input is quantized per token, so an ulp in silu may move one int8 step
    atol = (2e-3 if "w8a8" in (method, shared_method) else 1e-5) * float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)


def test_shared_expert_is_added_after_the_routed_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """No routed slot (k = 0): the op returns exactly the shared expert, and with
    slots exactly ``routed + shared`` of the two ops' own results."""
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(9)
    quant, shared = _stacked("wint8", rng), _shared("wint8", rng)
    x = paddle.to_tensor(rng.standard_normal((4, D)).astype(np.float32))
    weights, ids = _routing(rng, 4, 2)
    routed = fd_x86.moe.moe_experts(x, weights, ids, quant).numpy()
    none_w, none_ids = paddle.zeros([4, 0], dtype="float32"), paddle.zeros([4, 0], dtype="int64")
    alone = fd_x86.moe.moe_layer_experts(x, none_w, none_ids, quant, *shared).numpy()
    both = fd_x86.moe.moe_layer_experts(x, weights, ids, quant, *shared).numpy()
    np.testing.assert_array_equal(both, routed + alone)


def test_layer_experts_decline_what_the_op_does_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """None (the caller composes): unquantized shared or routed weights, an op
    turned off with FD_X86_MOE_NATIVE=0."""
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(6)
    quant, shared = _stacked("wint8", rng), _shared("wint8", rng)
    x = paddle.to_tensor(rng.standard_normal((2, D)).astype(np.float32))
    weights, ids = _routing(rng, 2, 2)
    dense = paddle.ones([D, 2 * SHARED]), paddle.ones([SHARED, D])
    assert fd_x86.moe.moe_layer_experts(x, weights, ids, quant, *dense) is None
    assert backend.fd_moe_layer_experts(x, weights, ids, x, x, None, *shared) is None
    monkeypatch.setenv("FD_X86_MOE_NATIVE", "0")
    assert fd_x86.moe.moe_layer_experts(x, weights, ids, quant, *shared) is None
    monkeypatch.delenv("FD_X86_MOE_NATIVE")
    with pytest.raises(Exception, match="shared down"):
        fd_x86.moe.moe_layer_experts(x, weights, ids, quant, shared[0], _shared("wint8", rng)[0])


@pytest.mark.parametrize("tokens", [1, 3, 33])
def test_block_fp8_experts_run_the_fp8_kernel_per_expert(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """block_wise_fp8 experts (FP8 checkpoints): each expert's projections on fd_x86's fp8
    kernel over its slice of the stacked codes, equal to the reference's grouped experts
    (fp32 summation order aside: a silu ulp may move one e4m3 activation code of down)."""
    import fd_x86.fp8

    from fd_core.quantization.reference import quantized_moe_experts

    if not fd_x86.fp8.available():
        pytest.skip("no native fp8 kernel on this CPU")
    rng = np.random.default_rng(tokens + 100)
    quant = _stacked("block_wise_fp8", rng)
    x = paddle.to_tensor(rng.standard_normal((tokens, D)).astype(np.float32))
    weights, ids = _routing(rng, tokens, 4)
    calls = []
    native = fd_x86.fp8.expert_block_fp8_linear
    monkeypatch.setattr(fd_x86.moe, "expert_block_fp8_linear",
                        lambda *a, **k: calls.append(a[2]) or native(*a, **k))
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    want = quantized_moe_experts(x, weights, ids, quant).numpy()
    got = fd_x86.moe.moe_experts(x, weights, ids, quant).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-2 * float(np.abs(want).max()))
    assert len(calls) == 2 * len(set(ids.numpy().reshape(-1).tolist()))  # up_gate and down per expert with tokens
    monkeypatch.setenv("FD_X86_MOE_NATIVE", "0")
    assert fd_x86.moe.moe_experts(x, weights, ids, quant) is None  # off: the reference answers
