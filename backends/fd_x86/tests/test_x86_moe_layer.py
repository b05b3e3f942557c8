"""A whole MoE layer in one native call (``fd_x86.moe.moe_layer``, the op
``fd_x86_moe_layer``): the same results as the separate native ops it
replaces (router linear, ``fd_x86_moe_select``, ``fd_x86_moe_experts(_shared)``),
its per-layer cache, and the cases it leaves to the composition."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build

paddle = pytest.importorskip("paddle")

import fd_x86.moe  # noqa: E402

from fd_core.backends import get_backend  # noqa: E402
from fd_core.ops.linear import QuantizedWeight  # noqa: E402
from fd_core.quantization.weights import quantize_array, quantize_weight  # noqa: E402

E, D, INTER, K = 16, 256, 128, 4


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    build.load_ops()


def _layer(method: str, rng: np.random.Generator, shared_method: str | None) -> dict[str, Any]:
    def stack(d_in: int, d_out: int) -> QuantizedWeight:
        parts = [quantize_array(method, rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05)
                 for _ in range(E)]
        return QuantizedWeight(method, paddle.to_tensor(np.stack([p[0] for p in parts])),
                               paddle.to_tensor(np.stack([p[1] for p in parts])), d_in, d_out, parts[0][2])

    def dense(d_in: int, d_out: int) -> Any:
        assert shared_method is not None
        return quantize_weight(shared_method, paddle.to_tensor(rng.standard_normal((d_in, d_out)).astype(np.float32)
                                                               * 0.05))

    return dict(gate=paddle.to_tensor(rng.standard_normal((D, E)).astype(np.float32) * 0.1),
                correction_bias=paddle.to_tensor(rng.normal(0, 0.05, E).astype(np.float32)), top_k=K,
                renormalize=True, norm_min=1e-12, up_gate_weights=None, down_weights=None,
                quant=(stack(D, 2 * INTER), stack(INTER, D)),
                shared_up_gate=dense(D, 2 * INTER) if shared_method else None,
                shared_down=dense(INTER, D) if shared_method else None)


@pytest.mark.parametrize("method, shared_method", [("wint8", "wint8"), ("wint4", "wint8"), ("w8a8", "w8a8"),
                                                   ("wint8", None)])
@pytest.mark.parametrize("tokens", [1, 5, 33])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_op_equals_the_separate_native_ops(method: str, shared_method: str | None, tokens: int, bias: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Same routing, same kernels: equal up to the router matmul's summation
    order (no near-ties in these draws)."""
    rng = np.random.default_rng(tokens * 7 + len(method))
    args = _layer(method, rng, shared_method)
    if not bias:
        args["correction_bias"] = None
    x = paddle.to_tensor(rng.standard_normal((tokens, D)).astype(np.float32))
    ops = get_backend("x86").ops
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    monkeypatch.setenv("FD_X86_MOE_LAYER", "0")
    want = ops.moe_layer(x, **args).numpy()
    monkeypatch.setenv("FD_X86_MOE_LAYER", "1")
    got = fd_x86.moe.moe_layer(x, *(args[k] for k in ("gate", "correction_bias", "top_k", "renormalize", "norm_min",
                                                        "quant", "shared_up_gate", "shared_down")))
    assert got is not None
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_the_layer_entry_is_kept_and_replaced_with_its_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    monkeypatch.delenv("FD_X86_MOE_LAYER", raising=False)
    rng = np.random.default_rng(0)
    args = _layer("wint8", rng, "wint8")
    x = paddle.to_tensor(rng.standard_normal((2, D)).astype(np.float32))
    call = [args[k] for k in ("gate", "correction_bias", "top_k", "renormalize", "norm_min", "quant",
                              "shared_up_gate", "shared_down")]
    first = fd_x86.moe.moe_layer(x, *call).numpy()
    entry = args["quant"][0].backend_cache[fd_x86.moe._LAYER_KEY]
    np.testing.assert_array_equal(fd_x86.moe.moe_layer(x, *call).numpy(), first)
    assert args["quant"][0].backend_cache[fd_x86.moe._LAYER_KEY] is entry  # reused
    call[0] = paddle.to_tensor(-call[0].numpy())  # another router: a new entry, other routing
    assert not np.allclose(fd_x86.moe.moe_layer(x, *call).numpy(), first)
    assert args["quant"][0].backend_cache[fd_x86.moe._LAYER_KEY] is not entry


def test_what_the_layer_op_leaves_to_the_composition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    rng = np.random.default_rng(1)
    args = _layer("wint8", rng, "wint8")
    x = paddle.to_tensor(rng.standard_normal((2, D)).astype(np.float32))
    names = ("gate", "correction_bias", "top_k", "renormalize", "norm_min", "quant", "shared_up_gate", "shared_down")
    call = [args[k] for k in names]
    assert fd_x86.moe.moe_layer(x, *call) is not None
    float_shared = call.copy()
    float_shared[6] = paddle.ones([D, 2 * INTER])  # an unquantized shared expert
    assert fd_x86.moe.moe_layer(x, *float_shared) is None
    mixed = call.copy()
    mixed[5] = (call[5][0], QuantizedWeight("w8a8", *[getattr(call[5][1], f) for f in
                                                       ("qweight", "scales", "in_features", "out_features")]))
    assert fd_x86.moe.moe_layer(x, *mixed) is None
    assert backend.fd_moe_layer(x, args["gate"], None, K, True, 1e-12, None, None, None, None, None) is None
    monkeypatch.setenv("FD_X86_MOE_LAYER", "0")
    assert fd_x86.moe.moe_layer(x, *call) is None
    monkeypatch.setenv("FD_X86_MOE_LAYER", "1")
    monkeypatch.setenv("FD_X86_MOE_NATIVE", "0")
    assert fd_x86.moe.moe_layer(x, *call) is None


def _as_method(quant: QuantizedWeight, method: str) -> QuantizedWeight:
    return QuantizedWeight(method, quant.qweight, quant.scales, quant.in_features, quant.out_features,
                           quant.group_size)


@pytest.mark.parametrize("method,shared_method,as_experts,as_shared", [
    ("wint8", "wint8", "w8a8", "w8a8"),  # w8a8's kernel on the same contract weights
    ("wint4", "wint8", "w4a8", "w8a8"),  # w4a8's expert kernel on wint4's layout (group 128)
])
def test_opt_in_int8_activations_on_prefill_sized_calls(monkeypatch: pytest.MonkeyPatch, method: str,
                                                        shared_method: str, as_experts: str, as_shared: str) -> None:
    """FD_X86_PREFILL_INT8_ACT=1: from PREFILL_INT8_MIN_ROWS tokens, wint8 / wint4 experts and a wint8 shared
    expert give the int8-activation method's results on the same weights (the formats are shared: w8a8 is
    wint8's, w4a8 stores wint4's layout); fewer tokens keep fp32 activations."""
    from fd_x86.linear import PREFILL_INT8_MIN_ROWS
    from fd_x86.offline import available

    if as_experts == "w4a8" and not available():
        pytest.skip("the w4a8 expert kernel needs AVX-512 VNNI")
    monkeypatch.delenv("FD_X86_MOE_NATIVE", raising=False)
    monkeypatch.delenv("FD_X86_MOE_LAYER", raising=False)
    rng = np.random.default_rng(3 if method == "wint8" else 5)
    args = _layer(method, rng, shared_method)
    names = ("gate", "correction_bias", "top_k", "renormalize", "norm_min", "quant", "shared_up_gate", "shared_down")
    call = [args[k] for k in names]
    converted = call[:5] + [tuple(_as_method(q, as_experts) for q in call[5]), _as_method(call[6], as_shared),
                            _as_method(call[7], as_shared)]
    big = paddle.to_tensor(rng.standard_normal((PREFILL_INT8_MIN_ROWS + 3, D)).astype(np.float32))
    small = big[:PREFILL_INT8_MIN_ROWS - 1]
    monkeypatch.delenv("FD_X86_PREFILL_INT8_ACT", raising=False)
    default_big, default_small = (fd_x86.moe.moe_layer(t, *call).numpy() for t in (big, small))
    int8_big = fd_x86.moe.moe_layer(big, *converted).numpy()
    monkeypatch.setenv("FD_X86_PREFILL_INT8_ACT", "1")
    np.testing.assert_array_equal(fd_x86.moe.moe_layer(big, *call).numpy(), int8_big)
    np.testing.assert_array_equal(fd_x86.moe.moe_layer(small, *call).numpy(), default_small)
    assert not np.array_equal(int8_big, default_big)
