"""The quantization methods of issue 22 (``block_wise_fp8``, ``w4a8``, ``w4afp8``, ``wint2``, ``w4a8_static``) at
their edges: partial 128-blocks and groups, one activation group far larger
than the rest of its token (per-group vs per-token scales), a zero token.
Each method runs only where the backend lists it in its capabilities; the
plain linear and MoE cases (``cases_dense``, ``cases_moe``) cover them too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fd_core.testing.conformance import STATE_KEY
from fd_core.testing.conformance.cases_dense import _reference_quantizer
from fd_core.testing.conformance.harness import Harness, case_rng, replace_tensors

METHODS = ("block_wise_fp8", "w4a8", "w4afp8")
_INT4 = ("w4a8", "w4afp8")  # two input channels per byte: even ``in`` only
# (tokens, in, out): partial blocks both ways, block-aligned, a wide output
SHAPES = [(1, 200, 130), (37, 384, 257), (128, 1024, 384), (5, 256, 1000)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ == "test_quantized_linear_edges":
        state = metafunc.config.stash[STATE_KEY]
        listed = state.backend.capabilities().quantization_methods if state.backend else ()
        cases: list[Any] = [(m, *s) for m in METHODS if m in listed for s in SHAPES
                            if m not in _INT4 or s[1] % 2 == 0]
        if not cases:
            cases = [pytest.param("none", 0, 0, 0, marks=pytest.mark.skip(
                reason=f"the backend lists none of {', '.join(METHODS)}"))]
        metafunc.parametrize("method,tokens,d_in,d_out", cases)


def test_quantized_linear_edges(conformance: Harness, method: str, tokens: int, d_in: int, d_out: int) -> None:
    fd = conformance
    rng = case_rng("quant_edges", method, tokens, d_in, d_out)
    x = rng.normal(0, 1, (tokens, d_in)).astype(np.float32)
    x[0, : min(128, d_in)] *= 40.0  # one group of token 0 dominates its row
    if tokens > 2:
        x[2] = 0.0
    x = fd.rounded(x)
    w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
    w[:, : min(128, d_out)] *= 10.0  # one block row of the weight far larger
    b = fd.rounded(rng.normal(0, 1, d_out))
    quantize = _reference_quantizer(method)
    with fd.on_host():
        qweight = quantize(method, fd.host(w))
    want = fd.call_reference("linear", x=fd.host(x), weight=None, bias=fd.host(b), quant=qweight)
    got = fd.call("linear", x=fd.device(x), weight=None, bias=fd.device(b),
                  quant=replace_tensors(qweight, lambda t: t.to(fd.place)))
    fd.assert_close("linear", f"{method}: x[{tokens}, {d_in}] @ W[{d_in}, {d_out}] dtype={fd.dtype}",
                    got, want, fd.tol())


@pytest.mark.parametrize("tokens,d_in,d_out", [(1, 128, 64), (9, 256, 130)])
def test_wint2_linear(conformance: Harness, tokens: int, d_in: int, d_out: int) -> None:
    """FastDeploy's 2-bit expert format (from offline checkpoints, never
    quantized at load): weights in its layout made by the test encoder; a
    backend without a kernel for it is answered by the reference."""
    from fd_core._paddle import import_paddle
    from fd_core.ops.linear import QuantizedWeight
    from fd_core.quantization.wint2 import encode_wint2, pack_scales

    paddle = import_paddle()
    fd = conformance
    rng = case_rng("wint2", tokens, d_in, d_out)
    x = fd.rounded(rng.normal(0, 1, (tokens, d_in)).astype(np.float32))
    qw, ws, sup, cs, zp = encode_wint2(rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32))
    with fd.on_host():
        quant = QuantizedWeight("wint2", paddle.to_tensor(qw), paddle.to_tensor(pack_scales(ws, sup, cs, zp)),
                                d_in, d_out, 64)
    want = fd.call_reference("linear", x=fd.host(x), weight=None, bias=None, quant=quant)
    got = fd.call("linear", x=fd.device(x), weight=None, bias=None,
                  quant=replace_tensors(quant, lambda t: t.to(fd.place)))
    fd.assert_close("linear", f"wint2: x[{tokens}, {d_in}] @ W[{d_in}, {d_out}] dtype={fd.dtype}", got, want,
                    fd.tol())


@pytest.mark.parametrize("tokens,d_in,d_out", [(1, 128, 64), (9, 256, 130), (37, 384, 257)])
def test_w4a8_static_linear(conformance: Harness, tokens: int, d_in: int, d_out: int) -> None:
    """FastDeploy's offline W4A8C8 experts (``w4a8_static``: int4 codes per channel,
    one static activation max per matrix; from offline checkpoints only): some
    activations past the static max (clipped to +-127), a zero token; a backend
    without a kernel for it is answered by the reference."""
    from fd_core._paddle import import_paddle
    from fd_core.ops.linear import QuantizedWeight
    from fd_core.quantization.wint import quantize_int4

    paddle = import_paddle()
    fd = conformance
    rng = case_rng("w4a8_static", tokens, d_in, d_out)
    x = rng.normal(0, 1, (tokens, d_in)).astype(np.float32)
    x[0, :8] *= 6.0  # beyond the calibrated max: clipped codes
    if tokens > 2:
        x[2] = 0.0
    x = fd.rounded(x)
    packed, w_scale = quantize_int4(rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32), group_size=-1)
    act_max = np.float32(3.0)  # a calibration max below some of x's values
    scales = np.stack([w_scale[:, 0], np.full(d_out, act_max, np.float32)], axis=1).astype(np.float32)
    with fd.on_host():
        quant = QuantizedWeight("w4a8_static", paddle.to_tensor(packed), paddle.to_tensor(scales), d_in, d_out, -1)
    want = fd.call_reference("linear", x=fd.host(x), weight=None, bias=None, quant=quant)
    got = fd.call("linear", x=fd.device(x), weight=None, bias=None,
                  quant=replace_tensors(quant, lambda t: t.to(fd.place)))
    fd.assert_close("linear", f"w4a8_static: x[{tokens}, {d_in}] @ W[{d_in}, {d_out}] dtype={fd.dtype}", got,
                    want, fd.tol())
