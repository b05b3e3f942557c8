"""``w4a8`` routed and shared experts in fd_x86's MoE ops (method code 5,
``csrc/kernels_w4a8_avx512.cc``): int4 codes in wint4's contract layout read in
place against per-token int8 activations on VNNI. Against fd-core's reference
(``fd_core.quantization.w4a8``), the few-token path against the per-expert loop
(bit for bit), a token alone against its row of a batch (bit for bit), a tiny
MoE checkpoint end to end, and the shapes the kernel declines (the reference
answers)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build

paddle = pytest.importorskip("paddle")

import fd_x86.moe  # noqa: E402
import fd_x86.offline  # noqa: E402

from fd_core.ops.linear import QuantizedWeight  # noqa: E402
from fd_core.quantization.weights import quantize_array  # noqa: E402

W4A8 = 5  # the ops' method code


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    if not fd_x86.offline.available():
        pytest.skip("the w4a8 expert kernel needs AVX-512 VNNI")
    build.load_ops()


E, D, INTER, INTER_S = 8, 256, 256, 384


def _weight(rng: np.random.Generator, d_in: int, d_out: int, group: int, experts: int = 0) -> QuantizedWeight:
    """A w4a8 weight, stacked over ``experts`` (0: 2-D), as the loader makes it."""
    parts = [quantize_array("w4a8", rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05, group)
             for _ in range(max(1, experts))]
    q = np.stack([p[0] for p in parts]) if experts else parts[0][0]
    s = np.stack([p[1] for p in parts]) if experts else parts[0][1]
    return QuantizedWeight("w4a8", paddle.to_tensor(q), paddle.to_tensor(np.ascontiguousarray(s)), d_in, d_out,
                           parts[0][2])


def _experts(rng: np.random.Generator, group: int, d: int = D, inter: int = INTER) -> tuple[QuantizedWeight, ...]:
    return _weight(rng, d, 2 * inter, group, E), _weight(rng, inter, d, group, E)


def _shared(rng: np.random.Generator, group: int, d: int = D) -> tuple[QuantizedWeight, QuantizedWeight]:
    return _weight(rng, d, 2 * INTER_S, group), _weight(rng, INTER_S, d, group)


def _routing(rng: np.random.Generator, tokens: int, top_k: int) -> tuple[Any, Any]:
    ids = np.stack([rng.permutation(E)[:top_k] for _ in range(tokens)]).astype(np.int64)
    return paddle.to_tensor(rng.random((tokens, top_k)).astype(np.float32)), paddle.to_tensor(ids)


def _reference(x: Any, weights: Any, ids: Any, quant: Any, shared: tuple[Any, Any] | None) -> np.ndarray:
    from fd_core.ops.activation import reference_silu_and_mul
    from fd_core.quantization.reference import quantized_moe_experts
    from fd_core.quantization.w4a8 import w4a8_linear

    out = quantized_moe_experts(x, weights, ids, quant)
    if shared is not None:  # added after the routed sum, as the reference's layer
        out = out + w4a8_linear(reference_silu_and_mul(w4a8_linear(x, shared[0])), shared[1])
    return np.asarray(out.numpy())


@pytest.mark.parametrize("with_shared", [False, True])
@pytest.mark.parametrize("group", [128, -1])
@pytest.mark.parametrize("tokens", [1, 3, 17, 40])
def test_native_experts_match_the_reference(tokens: int, group: int, with_shared: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(tokens * 10 + (group > 0) + 2 * with_shared)
    quant = _experts(rng, group)
    shared = _shared(rng, group) if with_shared else None
    xs = rng.standard_normal((tokens, D)).astype(np.float32)
    xs[0, :4] *= 8.0  # a few large inputs: the token's scale
    if tokens > 2:
        xs[1] = 0.0  # a zero token: scale 1, routed output 0
    x = paddle.to_tensor(xs)
    weights, ids = _routing(rng, tokens, 2)
    if shared is None:
        got = fd_x86.moe.moe_experts(x, weights, ids, quant)
    else:
        got = fd_x86.moe.moe_layer_experts(x, weights, ids, quant, *shared)
    assert got is not None  # the native op answered
    want = _reference(x, weights, ids, quant, shared)
    # an fp32 ulp of silu may move one int8 step of the down projection's input codes
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=2e-3 * float(np.abs(want).max()))
    if tokens > 2 and shared is None:
        assert not got.numpy()[1].any()


def _op(x: np.ndarray, ids: np.ndarray, w: np.ndarray, quant: tuple[Any, ...], shared: tuple[Any, Any] | None,
        threads: int) -> np.ndarray:
    ops = build.load_ops()
    up, down = quant
    args = [paddle.to_tensor(a) for a in (x, ids, w)] + [up.qweight, up.scales, down.qweight, down.scales]
    g = fd_x86.moe._group
    if shared is None:
        return np.asarray(ops.fd_x86_moe_experts(*args, W4A8, g(up), g(down), 0, threads).numpy())
    s_up, s_down = shared
    return np.asarray(ops.fd_x86_moe_experts_shared(
        *args, s_up.qweight, s_up.scales, s_down.qweight, s_down.scales, W4A8, g(up), g(down), W4A8, g(s_up),
        g(s_down), 0, threads).numpy())


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("with_shared", [False, True])
def test_few_tokens_equal_the_per_expert_loop_and_a_token_alone(threads: int, with_shared: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to 16 tokens take the one-parallel-region path (each thread a slice of every
    linear's channels), more the per-expert loop, FD_X86_MOE_FEW_TOKENS=0 the loop at
    every size: all the same bits; a token alone equals its row of a batch."""
    rng = np.random.default_rng(threads + 10 * with_shared)
    quant = _experts(rng, 128)
    shared = _shared(rng, 128) if with_shared else None
    tokens, k = 20, 3
    x = rng.standard_normal((tokens, D)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(tokens)]).astype(np.int64)
    w = rng.random((tokens, k)).astype(np.float32)
    monkeypatch.delenv("FD_X86_MOE_FEW_TOKENS", raising=False)
    whole = _op(x, ids, w, quant, shared, threads)  # 20 tokens: the per-expert loop
    for first, count in ((0, 1), (5, 1), (0, 3), (4, 8), (2, 16)):
        rows = slice(first, first + count)
        few = _op(x[rows], ids[rows], w[rows], quant, shared, threads)
        np.testing.assert_array_equal(few, whole[rows])
        monkeypatch.setenv("FD_X86_MOE_FEW_TOKENS", "0")
        np.testing.assert_array_equal(_op(x[rows], ids[rows], w[rows], quant, shared, threads), few)
        monkeypatch.delenv("FD_X86_MOE_FEW_TOKENS")
    batch = _op(x[:8], ids[:8], w[:8], quant, shared, threads)
    for t in range(8):
        np.testing.assert_array_equal(_op(x[t:t + 1], ids[t:t + 1], w[t:t + 1], quant, shared, threads),
                                      batch[t:t + 1])


def test_layer_op_runs_w4a8_experts_and_shared_expert(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-layer op (router, routing, w4a8 experts and shared expert) equals
    the reference's composition."""
    from fd_core.backends import get_backend

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    monkeypatch.delenv("FD_X86_MOE_LAYER", raising=False)
    rng = np.random.default_rng(5)
    s_up, s_down = _shared(rng, 128)
    args = dict(gate=paddle.to_tensor(rng.standard_normal((D, E)).astype(np.float32) * 0.1),
                correction_bias=paddle.to_tensor(rng.normal(0, 0.05, E).astype(np.float32)), top_k=2,
                renormalize=True, norm_min=1e-12, up_gate_weights=None, down_weights=None,
                quant=_experts(rng, 128), shared_up_gate=s_up, shared_down=s_down)
    x = paddle.to_tensor(rng.standard_normal((5, D)).astype(np.float32))
    got = backend.fd_moe_layer(x, **args)
    assert got is not None
    want = get_backend("cpu").ops.moe_layer(x, **args).numpy()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=2e-3 * float(np.abs(want).max()))


@pytest.mark.parametrize("group,d", [(64, 256), (128, 192)])
def test_shapes_the_kernel_declines_are_left_to_the_reference(group: int, d: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of 64, or widths not multiples of 128: the MoE hooks return None (the
    reference answers); the op itself refuses such weights by name."""
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(group + d)
    quant = _experts(rng, group, d=d, inter=128)
    shared = _shared(rng, 128, d=d)
    x = paddle.to_tensor(rng.standard_normal((2, d)).astype(np.float32))
    weights, ids = _routing(rng, 2, 2)
    assert fd_x86.moe.moe_experts(x, weights, ids, quant) is None
    assert fd_x86.moe.moe_layer_experts(x, weights, ids, quant, *shared) is None
    gate = paddle.to_tensor(rng.standard_normal((d, E)).astype(np.float32))
    assert fd_x86.moe.moe_layer(x, gate, None, 2, True, 1e-12, quant, *shared) is None
    with pytest.raises(Exception, match="multiples of 128"):
        _op(x.numpy(), ids.numpy(), weights.numpy(), quant, None, 1)


def test_experts_are_left_to_the_reference_when_the_op_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """FD_X86_MOE_NATIVE=0: the per-expert path has no w4a8 kernel."""
    monkeypatch.setenv("FD_X86_MOE_NATIVE", "0")
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal((2, D)).astype(np.float32))
    weights, ids = _routing(rng, 2, 2)
    assert fd_x86.moe.moe_experts(x, weights, ids, _experts(rng, 128)) is None


def test_tiny_moe_checkpoint_greedy_tokens_equal_the_reference(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated tiny MoE (widths 128) quantized with ``--quantization w4a8`` decodes
    the CPU reference's greedy tokens on x86, every MoE layer through the native
    layer op with w4a8 experts and shared expert."""
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.quantization.config import parse_quantization
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.testing.greedy import greedy_generate

    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    monkeypatch.delenv("FD_X86_MOE_LAYER", raising=False)
    model = generate_checkpoint(tmp_path / "moe", "tiny-moe", naming="paddle", seed=7, dtype="float32",
                                hidden_size=128, moe_intermediate_size=128)
    answered: list[str] = []
    real = fd_x86.moe.moe_layer

    def counted(x: Any, gate: Any, bias: Any, top_k: int, renorm: bool, norm_min: float, quant: Any,
                *shared: Any) -> Any:
        out = real(x, gate, bias, top_k, renorm, norm_min, quant, *shared)
        methods = [quant[0].method] + [s.method for s in shared if s is not None]
        answered.append("+".join(methods) if out is not None else "none")
        return out

    monkeypatch.setattr(fd_x86.moe, "moe_layer", counted)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(100, 1000, n)] for n in (5, 19)]

    def run(name: str) -> tuple[list[list[int]], list[list[float]]]:
        quantization = parse_quantization("w4a8", "Ernie4_5_MoeForCausalLM")
        runner = ModelRunner(model, get_backend(name), num_blocks=24, block_size=16, quantization=quantization)
        return greedy_generate(runner, prompts, 8, chunk_size=8)

    want_tokens, want_logprobs = run("cpu")
    got_tokens, got_logprobs = run("x86")
    assert answered and set(answered) == {"w4a8+w4a8+w4a8"}, answered
    assert got_tokens == want_tokens
    worst = max(abs(g - w) for gs, ws in zip(got_logprobs, want_logprobs) for g, w in zip(gs, ws))
    # per-token int8 codes may move a step where the fp32 order differs (here ~5e-3 with the
    # experts on the reference too, FD_X86_MOE_NATIVE=0)
    assert worst < 2e-2, worst


def _method_weight(rng: np.random.Generator, method: str, d_in: int, d_out: int, experts: int = 0) -> QuantizedWeight:
    parts = [quantize_array(method, rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05, 128)
             for _ in range(max(1, experts))]
    q = np.stack([p[0] for p in parts]) if experts else parts[0][0]
    s = np.stack([p[1] for p in parts]) if experts else parts[0][1]
    return QuantizedWeight(method, paddle.to_tensor(q), paddle.to_tensor(np.ascontiguousarray(s)), d_in, d_out,
                           parts[0][2])


# FastDeploy's W4A8 split (mix_quant: dense wint8, experts w4a8) gives routed w4a8 with a wint8 shared
# expert; the reverse and the int4 pairs take the same op with one kernel per weight
@pytest.mark.parametrize("routed,shared", [("w4a8", "wint8"), ("wint8", "w4a8"), ("w4a8", "wint4"),
                                           ("wint4", "w4a8")])
@pytest.mark.parametrize("tokens", [3, 20])  # the few-token region and the per-expert loop
def test_mixed_routed_and_shared_methods(routed: str, shared: str, tokens: int) -> None:
    from fd_core.backends import get_backend
    from fd_core.ops.activation import reference_silu_and_mul
    from fd_core.quantization.reference import quantized_moe_experts

    experts, d, inter, inter_shared = 8, 256, 256, 384
    rng = np.random.default_rng(1)
    quant = (_method_weight(rng, routed, d, 2 * inter, experts), _method_weight(rng, routed, inter, d, experts))
    up, down = _method_weight(rng, shared, d, 2 * inter_shared), _method_weight(rng, shared, inter_shared, d)
    x = paddle.to_tensor(rng.standard_normal((tokens, d)).astype(np.float32))
    ids = paddle.to_tensor(np.stack([rng.permutation(experts)[:2] for _ in range(tokens)]).astype(np.int64))
    tw = paddle.to_tensor(rng.random((tokens, 2)).astype(np.float32))
    got = fd_x86.moe.moe_layer_experts(x, tw, ids, quant, up, down)
    assert got is not None, f"routed {routed} with a {shared} shared expert was not answered natively"
    ref = get_backend("cpu").ops
    want = (quantized_moe_experts(x, tw, ids, quant)
            + ref.linear(reference_silu_and_mul(ref.linear(x, None, None, up)), None, None, down)).numpy()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    alone = [fd_x86.moe.moe_layer_experts(x[t:t + 1], tw[t:t + 1], ids[t:t + 1], quant, up, down).numpy()[0]
             for t in range(tokens)]
    np.testing.assert_array_equal(np.stack(alone), got.numpy())  # a token's bits do not depend on its batch
