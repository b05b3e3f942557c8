"""Dense per-token ops: rms_norm, rotary_embedding, silu_and_mul, linear
(unquantized and every quantization method the backend lists), and the
single-rank communicator."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from fd_core.ops.linear import QuantizedWeight
from fd_core.ops.rope import rope_cos_sin
from fd_core.testing.conformance import STATE_KEY
from fd_core.testing.conformance.harness import Harness, Tolerance, case_rng, replace_tensors

EXACT = Tolerance(rtol=0.0, atol=0.0)
# Token counts: one token, an odd ragged count, a full-ish batch.
TOKENS = (1, 37, 128)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ == "test_linear":
        # Unquantized, then every quantization method the backend lists.
        state = metafunc.config.stash[STATE_KEY]
        methods = state.quant_methods()
        cases = [("none", *shape) for shape in LINEAR_SHAPES]
        cases += [(m, *shape) for m in methods for shape in LINEAR_SHAPES if shape[1] % 256 == 0]
        metafunc.parametrize("method,tokens,d_in,d_out", cases)
    if metafunc.function.__name__ == "test_linear_on_bf16_activations":
        methods = metafunc.config.stash[STATE_KEY].quant_methods()
        bf16_cases: list[Any] = [(m, *shape) for m in methods for shape in LINEAR_SHAPES if shape[1] % 256 == 0]
        if not bf16_cases:
            bf16_cases = [pytest.param("none", 0, 0, 0, marks=pytest.mark.skip(reason="the backend lists no method"))]
        metafunc.parametrize("method,tokens,d_in,d_out", bf16_cases)


# ------------------------------------------------------------------ rms_norm


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden,eps", [(100, 1e-5), (1024, 1e-6), (1027, 1e-5), (3 * 960, 1e-6)])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm(conformance: Harness, tokens: int, hidden: int, eps: float, with_residual: bool) -> None:
    fd = conformance
    rng = case_rng("rms_norm", tokens, hidden, with_residual)
    x = fd.rounded(rng.normal(0, 1.5, (tokens, hidden)))
    w = fd.rounded(rng.normal(1, 0.2, hidden))
    res = fd.rounded(rng.normal(0, 1.0, (tokens, hidden))) if with_residual else None
    case = f"x[{tokens}, {hidden}] eps={eps:g} residual={with_residual} dtype={fd.dtype}"
    got = fd.call("rms_norm", x=fd.device(x), weight=fd.device(w), eps=eps,
                  residual=None if res is None else fd.device(res))
    want = fd.call_reference("rms_norm", x=fd.host(x), weight=fd.host(w), eps=eps,
                             residual=None if res is None else fd.host(res))
    if not with_residual:
        fd.assert_close("rms_norm", case, got, want, fd.tol())
        return
    if not isinstance(got, tuple | list) or len(got) != 2:
        raise AssertionError(f"rms_norm [{case}]: with a residual it must return (normed, x + residual)")
    fd.assert_close("rms_norm", case + " (normed)", got[0], want[0], fd.tol())
    fd.assert_close("rms_norm", case + " (x + residual)", got[1], want[1], fd.tol())


def test_rms_norm_small_activations_show_eps(conformance: Harness) -> None:
    # eps dominates the mean square here: a kernel that drops or misplaces it shows.
    fd = conformance
    x = fd.rounded(np.full((3, 96), 0.01, dtype=np.float32))
    w = fd.rounded(case_rng("rms_eps").normal(1, 0.2, 96))
    case = "x[3, 96] = 0.01, eps=1e-2"
    got = fd.call("rms_norm", x=fd.device(x), weight=fd.device(w), eps=1e-2, residual=None)
    want = fd.call_reference("rms_norm", x=fd.host(x), weight=fd.host(w), eps=1e-2, residual=None)
    fd.assert_close("rms_norm", case, got, want, fd.tol())


# ---------------------------------------------------------- rotary_embedding


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim", [
    (1, 8, 2, 128), (37, 16, 2, 128), (37, 4, 4, 64), (128, 12, 1, 96)
])
def test_rotary_embedding(
    conformance: Harness, interleaved: bool, tokens: int, heads: int, kv_heads: int, head_dim: int
) -> None:
    fd = conformance
    rng = case_rng("rope", interleaved, tokens, heads, head_dim)
    max_pos = 4096
    q = fd.rounded(rng.normal(0, 1, (tokens, heads, head_dim)))
    k = fd.rounded(rng.normal(0, 1, (tokens, kv_heads, head_dim)))
    positions = rng.integers(0, max_pos, tokens).astype(np.int64)
    positions[0] = max_pos - 1  # the last row of the table
    with fd.on_host():
        cos_sin = rope_cos_sin(head_dim, max_pos, 500000.0).numpy()
    case = f"q[{tokens}, {heads}, {head_dim}] k[{tokens}, {kv_heads}, {head_dim}] interleaved={interleaved}"
    got_q, got_k = fd.call(
        "rotary_embedding", q=fd.device(q), k=fd.device(k), positions=fd.device(positions),
        cos_sin=fd.device(cos_sin, "float32"), interleaved=interleaved,
    )
    want_q, want_k = fd.call_reference(
        "rotary_embedding", q=fd.host(q), k=fd.host(k), positions=fd.host(positions),
        cos_sin=fd.host(cos_sin), interleaved=interleaved,
    )
    fd.assert_close("rotary_embedding", case + " (q)", got_q, want_q, fd.tol())
    fd.assert_close("rotary_embedding", case + " (k)", got_k, want_k, fd.tol())


# -------------------------------------------------------------- silu_and_mul


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("inter", [1, 96, 1000, 3 * 1000 + 8])
def test_silu_and_mul(conformance: Harness, tokens: int, inter: int) -> None:
    fd = conformance
    x = fd.rounded(case_rng("silu", tokens, inter).normal(0, 2, (tokens, 2 * inter)))
    got = fd.call("silu_and_mul", x=fd.device(x))
    want = fd.call_reference("silu_and_mul", x=fd.host(x))
    fd.assert_close("silu_and_mul", f"x[{tokens}, {2 * inter}]", got, want, fd.tol())


# -------------------------------------------------------------------- linear

# (tokens, in, out); quantized methods use the shapes whose ``in`` is a multiple of 256.
LINEAR_SHAPES = [(1, 64, 96), (37, 100, 300), (128, 1024, 3 * 1000), (37, 2048, 8), (1, 512, 384)]


@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_linear(
    conformance: Harness, method: str, tokens: int, d_in: int, d_out: int, with_bias: bool
) -> None:
    """``method`` is "none" or one of the backend's ``quantization_methods``."""
    fd = conformance
    rng = case_rng("linear", method, tokens, d_in, d_out, with_bias)
    x = fd.rounded(rng.normal(0, 1, (tokens, d_in)))
    w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
    b = fd.rounded(rng.normal(0, 1, d_out)) if with_bias else None
    bias_dev = None if b is None else fd.device(b)
    bias_host = None if b is None else fd.host(b)
    case = f"{method}: x[{tokens}, {d_in}] @ W[{d_in}, {d_out}] bias={with_bias} dtype={fd.dtype}"
    if method == "none":
        w = fd.rounded(w)
        got = fd.call("linear", x=fd.device(x), weight=fd.device(w), bias=bias_dev, quant=None)
        want = fd.call_reference("linear", x=fd.host(x), weight=fd.host(w), bias=bias_host, quant=None)
    else:
        quantize = _reference_quantizer(method)
        with fd.on_host():
            qweight = quantize(method, fd.host(w))
        want = fd.call_reference("linear", x=fd.host(x), weight=None, bias=bias_host, quant=qweight)
        on_device = replace_tensors(qweight, lambda t: t.to(fd.place))
        got = fd.call("linear", x=fd.device(x), weight=None, bias=bias_dev, quant=on_device)
    fd.assert_close("linear", case, got, want, fd.tol())


def _reference_quantizer(method: str) -> Any:
    """``fd_core.quantization.quantize_weight(method, weight [in, out]) ->
    QuantizedWeight``: the reference's way to quantize, which fixes the layout
    the reference (and the backend) dequantize from."""
    try:
        quantization = importlib.import_module("fd_core.quantization")
        quantize = quantization.quantize_weight
    except (ImportError, AttributeError) as exc:
        pytest.fail(
            f"linear [{method}]: the backend lists quantization method {method!r}, but fd-core "
            f"has no reference quantizer to check it against "
            f"(fd_core.quantization.quantize_weight: {exc})"
        )

    def checked(name: str, weight: Any) -> QuantizedWeight:
        qweight = quantize(name, weight)
        assert isinstance(qweight, QuantizedWeight), type(qweight)
        return qweight

    return checked


# -------------------------------------------------------------- communicator


def test_communicator_single_rank_is_identity(conformance: Harness) -> None:
    fd = conformance
    x = fd.rounded(case_rng("comm").normal(0, 1, (37, 100)))
    comm = fd.call("communicator", world_size=1, rank=0, group=None)
    for name, call in [
        ("all_reduce", lambda t: comm.all_reduce(t)),
        ("all_gather", lambda t: comm.all_gather(t, axis=-1)),
        ("all_to_all", lambda t: comm.all_to_all(t)),
    ]:
        out = call(fd.device(x))
        fd.assert_close("communicator", f"world_size=1 {name} x[37, 100]", out, x, EXACT)


def test_linear_on_bf16_activations(conformance: Harness, method: str, tokens: int, d_in: int, d_out: int) -> None:
    """A weight whose model's activations are bf16 (``QuantizedWeight.act_dtype``) may round
    the activations to bf16 at the linear; given activations that are bf16 values already (in
    fp32 tensors, as a backend keeping fp32 between ops holds them), the result is the
    reference's to fp32 tolerance: the rounding changes nothing, nor may anything else."""
    fd = conformance
    rng = case_rng("linear_bf16_act", method, tokens, d_in, d_out)
    x = fd.rounded(fd.rounded(rng.normal(0, 1, (tokens, d_in)), "bfloat16"))
    w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
    quantize = _reference_quantizer(method)
    with fd.on_host():
        qweight = quantize(method, fd.host(w))
    qweight.act_dtype = "bfloat16"
    want = fd.call_reference("linear", x=fd.host(x), weight=None, bias=None, quant=qweight)
    got = fd.call("linear", x=fd.device(x), weight=None, bias=None,
                  quant=replace_tensors(qweight, lambda t: t.to(fd.place)))
    fd.assert_close("linear", f"{method}, act_dtype bfloat16: x[{tokens}, {d_in}] @ W[{d_in}, {d_out}] "
                    f"dtype={fd.dtype}", got, want, fd.tol())
