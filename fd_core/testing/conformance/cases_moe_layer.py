"""A whole MoE layer in one call (the optional ``fd_moe_layer``): router
matmul, routing with and without the correction bias, routed experts and the
shared expert, against the reference's composition of the per-op hooks."""

from __future__ import annotations

import numpy as np
import pytest

from fd_core._paddle import import_paddle
from fd_core.testing.conformance import STATE_KEY
from fd_core.testing.conformance.cases_moe import ACT_QUANTIZED, MIN_GAP, expert_args
from fd_core.testing.conformance.harness import Harness, Tolerance, case_rng

paddle = import_paddle()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ == "test_moe_layer":
        state = metafunc.config.stash[STATE_KEY]
        methods = list(state.quant_methods())
        metafunc.parametrize("method", ["none", *methods])


def _routable(rng: np.random.Generator, tokens: int, hidden: int, gate: np.ndarray, top_k: int,
              bias: np.ndarray | None) -> np.ndarray:
    """Rows of x whose routing is unambiguous: the k-th and (k+1)-th scores of
    ``softmax(x @ gate) + bias`` differ by at least MIN_GAP, so a router
    matmul summed in another order picks the same experts."""
    x = rng.normal(0, 1, (tokens, hidden)).astype(np.float32)
    while True:
        logits = x.astype(np.float64) @ gate.astype(np.float64)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        scores = np.sort(probs + (0 if bias is None else bias), axis=-1)[:, ::-1]
        tight = scores[:, top_k - 1] - scores[:, top_k] < MIN_GAP
        if not tight.any():
            return x
        x[tight] = rng.normal(0, 1, (int(tight.sum()), hidden))


@pytest.mark.parametrize("with_shared", [True, False], ids=["shared", "noshared"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("tokens,hidden,inter,experts,top_k", [(1, 256, 256, 8, 2), (37, 256, 512, 16, 4)])
def test_moe_layer(
    conformance: Harness, method: str, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
    with_bias: bool, with_shared: bool,
) -> None:
    """``Ops.moe_layer`` (the backend's fd_moe_layer where it answers, else the
    router linear + moe_select_experts + moe_experts(_with_shared)) against the
    reference's composition; experts and shared expert quantized with
    ``method`` ("none": fp weights); the router and its bias stay fp32."""
    fd = conformance
    rng = case_rng("moe_layer", method, tokens, hidden, inter, experts, top_k, with_bias, with_shared)
    gate = rng.normal(0, 2 * hidden**-0.5, (hidden, experts)).astype(np.float32)
    bias = rng.normal(0, 0.05, experts).astype(np.float32) if with_bias else None
    x = fd.rounded(_routable(rng, tokens, hidden, gate, top_k, bias))
    up_gate = rng.normal(0, hidden**-0.5, (experts, hidden, 2 * inter)).astype(np.float32)
    down = rng.normal(0, inter**-0.5, (experts, inter, hidden)).astype(np.float32)
    s_up = rng.normal(0, hidden**-0.5, (hidden, 2 * inter)).astype(np.float32)
    s_down = rng.normal(0, inter**-0.5, (inter, hidden)).astype(np.float32)
    routing = dict(gate=fd.device(gate, "float32"), correction_bias=None if bias is None else fd.device(bias, "float32"),
                   top_k=top_k, renormalize=True, norm_min=1e-12)
    host_routing = dict(gate=fd.host(gate), correction_bias=None if bias is None else fd.host(bias), top_k=top_k,
                        renormalize=True, norm_min=1e-12)
    args, host = expert_args(fd, method, up_gate, down, s_up, s_down)
    if not with_shared:
        args.update(shared_up_gate=None, shared_down=None)
        host.update(shared_up_gate=None, shared_down=None)
    case = (f"{method}: x[{tokens}, {hidden}] experts={experts} top_k={top_k} inter={inter} bias={with_bias} "
            f"shared={with_shared} dtype={fd.dtype}")
    got = fd.call_fused("moe_layer", x=fd.device(x), **routing, **args)
    with fd.on_host():
        want = fd.reference.ops.moe_layer(x=fd.host(x), **host_routing, **host)
    # w8a8 / w4a8 (and the fp8-activation methods) quantize the FFN's hidden activations too: a
    # last-bit difference in silu can move one int8 code, which the down projection spreads
    tol = fd.tol() if method not in ACT_QUANTIZED else fd.tol().looser(Tolerance(rtol=2e-2, atol=2e-2))
    fd.assert_close("moe_layer", case, got, want, tol if fd.override is None else fd.override)
