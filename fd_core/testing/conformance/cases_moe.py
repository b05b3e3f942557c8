"""Mixture of experts: routing (moe_select_experts) and the routed experts'
FFN (moe_experts) with uneven loads and experts that receive no tokens; the
optional fused routed + shared experts (moe_layer_experts) against the
reference's composition."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fd_core._paddle import import_paddle
from fd_core.ops.linear import QuantizedWeight
from fd_core.testing.conformance import STATE_KEY
from fd_core.testing.conformance.harness import (
    COMPOSED,
    NATIVE,
    Harness,
    Tolerance,
    case_rng,
    replace_tensors,
)

paddle = import_paddle()

MIN_GAP = 1e-4  # routing scores closer than this at the top-k boundary are regenerated


def _router_logits(rng: np.random.Generator, tokens: int, experts: int, top_k: int,
                   bias: np.ndarray | None) -> np.ndarray:
    """Logits whose selection is unambiguous: the k-th and (k+1)-th scores
    differ by at least MIN_GAP, so ids compare exactly on any device."""
    logits = rng.normal(0, 2, (tokens, experts)).astype(np.float32)
    while True:
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        scores = np.sort(probs + (0 if bias is None else bias), axis=-1)[:, ::-1]
        if top_k == experts:
            return logits
        tight = scores[:, top_k - 1] - scores[:, top_k] < MIN_GAP
        if not tight.any():
            return logits
        logits[tight] = rng.normal(0, 2, (int(tight.sum()), experts))


@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("tokens,experts,top_k", [(1, 8, 2), (37, 64, 6), (128, 64, 8), (37, 7, 1)])
def test_moe_select_experts(
    conformance: Harness, tokens: int, experts: int, top_k: int, with_bias: bool, renormalize: bool
) -> None:
    fd = conformance
    rng = case_rng("moe_select", tokens, experts, top_k, with_bias, renormalize)
    # A correction bias comparable to the probabilities, so it changes the choice.
    bias = rng.normal(0, 0.05, experts).astype(np.float32) if with_bias else None
    logits = _router_logits(rng, tokens, experts, top_k, bias)
    case = f"router_logits[{tokens}, {experts}] top_k={top_k} bias={with_bias} renormalize={renormalize}"
    got_w, got_ids = fd.call(
        "moe_select_experts", router_logits=fd.device(logits, "float32"), top_k=top_k,
        correction_bias=None if bias is None else fd.device(bias, "float32"),
        renormalize=renormalize, norm_min=1e-12,
    )
    want_w, want_ids = fd.call_reference(
        "moe_select_experts", router_logits=fd.host(logits), top_k=top_k,
        correction_bias=None if bias is None else fd.host(bias),
        renormalize=renormalize, norm_min=1e-12,
    )
    # The order of the k picks is not part of the contract: compare per row by id.
    got_ids_np, want_ids_np = fd.numpy(got_ids).astype(np.int64), fd.numpy(want_ids)
    got_order, want_order = np.argsort(got_ids_np, -1), np.argsort(want_ids_np, -1)
    fd.assert_equal("moe_select_experts", case + " (topk_ids, sorted per row)",
                    np.take_along_axis(got_ids_np, got_order, -1),
                    np.take_along_axis(want_ids_np, want_order, -1))
    fd.assert_close("moe_select_experts", case + " (topk_weights, in id order)",
                    np.take_along_axis(fd.numpy(got_w), got_order, -1),
                    np.take_along_axis(fd.numpy(want_w), want_order, -1),
                    fd.tol("float32"))


def _uneven_routing(rng: np.random.Generator, tokens: int, experts: int, top_k: int,
                    empty: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct expert ids per token drawn from a skewed distribution (expert 0
    heaviest) that never picks the ``empty`` experts; positive weights."""
    popularity = 1.0 / np.arange(1, experts + 1) ** 1.5
    popularity[list(empty)] = 0.0
    popularity /= popularity.sum()
    ids = np.stack([rng.choice(experts, top_k, replace=False, p=popularity) for _ in range(tokens)])
    weights = rng.uniform(0.05, 1.0, (tokens, top_k)).astype(np.float32)
    weights /= weights.sum(-1, keepdims=True)
    return weights, ids.astype(np.int64)


@pytest.mark.parametrize("tokens,hidden,inter,experts,top_k,empty", [
    (1, 64, 96, 8, 2, (3,)),
    (37, 100, 80, 8, 2, (1, 5)),
    (128, 256, 3 * 96, 16, 4, (2, 7, 11)),
    (37, 96, 64, 4, 1, (0, 1, 3)),  # every token to one expert
])
def test_moe_experts(
    conformance: Harness, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
    empty: tuple[int, ...],
) -> None:
    fd = conformance
    rng = case_rng("moe_experts", tokens, hidden, inter, experts, top_k)
    x = fd.rounded(rng.normal(0, 1, (tokens, hidden)))
    up_gate = fd.rounded(rng.normal(0, hidden**-0.5, (experts, hidden, 2 * inter)))
    down = fd.rounded(rng.normal(0, inter**-0.5, (experts, inter, hidden)))
    weights, ids = _uneven_routing(rng, tokens, experts, top_k, empty)
    loads = np.bincount(ids.reshape(-1), minlength=experts).tolist()
    case = (f"x[{tokens}, {hidden}] experts={experts} top_k={top_k} inter={inter} "
            f"tokens per expert={loads} dtype={fd.dtype}")
    got = fd.call("moe_experts", x=fd.device(x), topk_weights=fd.device(weights, "float32"),
                  topk_ids=fd.device(ids), up_gate_weights=fd.device(up_gate),
                  down_weights=fd.device(down), quant=None)
    want = fd.call_reference("moe_experts", x=fd.host(x), topk_weights=fd.host(weights),
                             topk_ids=fd.host(ids), up_gate_weights=fd.host(up_gate),
                             down_weights=fd.host(down), quant=None)
    fd.assert_close("moe_experts", case, got, want, fd.tol())



# ------------------------------------------------------- quantized experts

# (tokens, hidden, inter, experts, top_k, experts that get no tokens); sizes
# that every method's grouping takes (multiples of 256)
ACT_QUANTIZED = ("w8a8", "block_wise_fp8", "w4a8", "w4afp8")  # methods that quantize the activations per call
QUANTIZED_MOE = [(1, 256, 256, 8, 2, ()), (37, 256, 512, 8, 2, (1, 5))]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    name = metafunc.function.__name__
    if name in ("test_moe_experts_quantized", "test_moe_layer_experts"):
        state = metafunc.config.stash[STATE_KEY]
        methods = list(state.quant_methods())
        metafunc.parametrize("method", methods if name == "test_moe_experts_quantized" else ["none", *methods])


def _stack_quantized(fd: Harness, method: str, weights: np.ndarray) -> QuantizedWeight:
    """Experts ``[E, in, out]`` quantized one by one with the reference
    quantizer and stacked on a leading expert axis (host tensors)."""
    from fd_core.testing.conformance.cases_dense import _reference_quantizer

    quantize = _reference_quantizer(method)
    with fd.on_host():
        per_expert = [quantize(method, fd.host(w)) for w in weights]
        first = per_expert[0]
        return QuantizedWeight(
            method, paddle.stack([q.qweight for q in per_expert]), paddle.stack([q.scales for q in per_expert]),
            first.in_features, first.out_features, first.group_size,
        )


@pytest.mark.parametrize("tokens,hidden,inter,experts,top_k,empty", QUANTIZED_MOE)
def test_moe_experts_quantized(
    conformance: Harness, method: str, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
    empty: tuple[int, ...],
) -> None:
    """Experts quantized with each method the backend lists, against the
    reference's numerics for that method (its linear on each expert's slice)."""
    fd = conformance
    rng = case_rng("moe_experts_quantized", method, tokens, hidden, inter, experts, top_k)
    x = fd.rounded(rng.normal(0, 1, (tokens, hidden)))
    up_gate = _stack_quantized(fd, method, rng.normal(0, hidden**-0.5, (experts, hidden, 2 * inter)).astype(np.float32))
    down = _stack_quantized(fd, method, rng.normal(0, inter**-0.5, (experts, inter, hidden)).astype(np.float32))
    weights, ids = _uneven_routing(rng, tokens, experts, top_k, empty)
    case = f"{method}: x[{tokens}, {hidden}] experts={experts} top_k={top_k} inter={inter} dtype={fd.dtype}"
    on_device = tuple(replace_tensors(q, lambda t: t.to(fd.place)) for q in (up_gate, down))
    got = fd.call("moe_experts", x=fd.device(x), topk_weights=fd.device(weights, "float32"),
                  topk_ids=fd.device(ids), up_gate_weights=None, down_weights=None, quant=on_device)
    want = fd.call_reference("moe_experts", x=fd.host(x), topk_weights=fd.host(weights),
                             topk_ids=fd.host(ids), up_gate_weights=None, down_weights=None,
                             quant=(up_gate, down))
    # w8a8 and block_wise_fp8 quantize the FFN's hidden activations too: a last-bit
    # difference in silu can move one int8 / e4m3 code, which the down projection spreads
    tol = fd.tol() if method not in ACT_QUANTIZED else fd.tol().looser(Tolerance(rtol=2e-2, atol=2e-2))
    fd.assert_close("moe_experts", case, got, want, tol if fd.override is None else fd.override)


# ------------------------------------------- routed + shared expert (optional fusion)


def _quantized_2d(fd: Harness, method: str, weight: np.ndarray) -> QuantizedWeight:
    from fd_core.testing.conformance.cases_dense import _reference_quantizer

    with fd.on_host():
        return _reference_quantizer(method)(method, fd.host(weight))  # type: ignore[no-any-return]


def expert_args(fd: Harness, method: str, up_gate: np.ndarray, down: np.ndarray, s_up: np.ndarray,
                s_down: np.ndarray) -> tuple[dict[str, Any], dict[str, Any]]:
    """The experts' and shared expert's arguments of ``moe_experts_with_shared`` /
    ``moe_layer``, on the device and on the host: fp weights rounded to the case's
    dtype for ``method`` "none", else quantized with ``method``."""
    if method == "none":
        up_gate, down, s_up, s_down = (fd.rounded(w) for w in (up_gate, down, s_up, s_down))
        args = dict(up_gate_weights=fd.device(up_gate), down_weights=fd.device(down), quant=None,
                    shared_up_gate=fd.device(s_up), shared_down=fd.device(s_down))
        host = dict(up_gate_weights=fd.host(up_gate), down_weights=fd.host(down), quant=None,
                    shared_up_gate=fd.host(s_up), shared_down=fd.host(s_down))
        return args, host
    quant = (_stack_quantized(fd, method, up_gate), _stack_quantized(fd, method, down))
    shared = (_quantized_2d(fd, method, s_up), _quantized_2d(fd, method, s_down))
    on_device = [replace_tensors(q, lambda t: t.to(fd.place)) for q in (*quant, *shared)]
    args = dict(up_gate_weights=None, down_weights=None, quant=tuple(on_device[:2]),
                shared_up_gate=on_device[2], shared_down=on_device[3])
    host = dict(up_gate_weights=None, down_weights=None, quant=quant, shared_up_gate=shared[0],
                shared_down=shared[1])
    return args, host


@pytest.mark.parametrize("tokens,hidden,inter,shared_inter,experts,top_k,empty", [
    (1, 256, 256, 512, 8, 2, ()), (37, 256, 512, 256, 8, 2, (1, 5)),
])
def test_moe_layer_experts(
    conformance: Harness, method: str, tokens: int, hidden: int, inter: int, shared_inter: int, experts: int,
    top_k: int, empty: tuple[int, ...],
) -> None:
    """``Ops.moe_experts_with_shared`` (the backend's fd_moe_layer_experts
    where it answers, else moe_experts + the shared GatedMLP) against the
    reference's composition; experts and shared expert quantized with
    ``method`` ("none": fp weights)."""
    fd = conformance
    rng = case_rng("moe_layer_experts", method, tokens, hidden, inter, shared_inter, experts, top_k)
    x = fd.rounded(rng.normal(0, 1, (tokens, hidden)))
    up_gate = rng.normal(0, hidden**-0.5, (experts, hidden, 2 * inter)).astype(np.float32)
    down = rng.normal(0, inter**-0.5, (experts, inter, hidden)).astype(np.float32)
    s_up = rng.normal(0, hidden**-0.5, (hidden, 2 * shared_inter)).astype(np.float32)
    s_down = rng.normal(0, shared_inter**-0.5, (shared_inter, hidden)).astype(np.float32)
    weights, ids = _uneven_routing(rng, tokens, experts, top_k, empty)
    routing = dict(topk_weights=fd.device(weights, "float32"), topk_ids=fd.device(ids))
    host_routing = dict(topk_weights=fd.host(weights), topk_ids=fd.host(ids))
    args, host = expert_args(fd, method, up_gate, down, s_up, s_down)
    case = (f"{method}: x[{tokens}, {hidden}] experts={experts} top_k={top_k} inter={inter} "
            f"shared_inter={shared_inter} dtype={fd.dtype}")
    result = None
    if fd.implements("moe_layer_experts") and not fd.is_reference:
        only_backend = fd.backend.pm.subset_hook_caller("fd_moe_layer_experts", remove_plugins=[fd.reference_module])
        result = only_backend(x=fd.device(x), **routing, **args)
    fd.answers.setdefault("moe_layer_experts", set()).add(NATIVE if result is not None else COMPOSED)
    got = result if result is not None else fd.backend.ops.moe_experts_with_shared(x=fd.device(x), **routing, **args)
    with fd.on_host():
        want = fd.reference.ops.moe_experts_with_shared(x=fd.host(x), **host_routing, **host)
    tol = fd.tol() if method not in ACT_QUANTIZED else fd.tol().looser(Tolerance(rtol=2e-2, atol=2e-2))
    fd.assert_close("moe_layer_experts", case, got, want, tol if fd.override is None else fd.override)
