"""``Ops.moe_layer``: a backend's whole MoE layer (``fd_moe_layer``: router,
routing, routed and shared experts) when it answers, else the router linear,
``moe_select_experts`` and ``moe_experts_with_shared`` / ``moe_experts``
through the unfused hooks, exactly as MoE layers composed them before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fd_core.backends import cpu
from fd_core.backends.base import Ops
from fd_core.plugins import hookimpl
from fd_core.plugins.manager import make_plugin_manager

paddle = pytest.importorskip("paddle")

T, D, E, K, INTER = 5, 64, 8, 2, 32


def _inputs(rng: np.random.Generator, shared: bool) -> dict[str, Any]:
    def t(*shape: int, scale: float = 0.1) -> Any:
        return paddle.to_tensor(rng.standard_normal(shape).astype(np.float32) * scale)

    return dict(x=t(T, D, scale=1.0), gate=t(D, E), correction_bias=t(E, scale=0.05), top_k=K, renormalize=True,
                norm_min=1e-12, up_gate_weights=t(E, D, 2 * INTER), down_weights=t(E, INTER, D), quant=None,
                shared_up_gate=t(D, 2 * INTER) if shared else None, shared_down=t(INTER, D) if shared else None)


def _composed(ops: Ops, a: dict[str, Any]) -> Any:
    """The MoE layer's calls before ``fd_moe_layer``."""
    logits = ops.linear(a["x"].astype("float32"), a["gate"])
    w, ids = ops.moe_select_experts(logits, a["top_k"], a["correction_bias"], a["renormalize"], a["norm_min"])
    if a["shared_up_gate"] is None:
        return ops.moe_experts(a["x"], w, ids, a["up_gate_weights"], a["down_weights"], a["quant"])
    return ops.moe_experts_with_shared(a["x"], w, ids, a["up_gate_weights"], a["down_weights"], a["quant"],
                                       a["shared_up_gate"], a["shared_down"])


@pytest.mark.parametrize("bind", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_without_a_fusing_backend_the_ops_compose_the_unfused_hooks(bind: bool, shared: bool) -> None:
    a = _inputs(np.random.default_rng(0), shared)
    ops = Ops(make_plugin_manager(cpu), "cpu", bind=bind)
    assert ops.implementers("moe_layer") == []  # the reference does not implement it
    np.testing.assert_array_equal(ops.moe_layer(**a).numpy(), _composed(ops, a).numpy())


class _Fusing:
    """A backend answering ``fd_moe_layer`` with ``answer``."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.asked = answer, 0

    @hookimpl
    def fd_moe_layer(self, x: Any, gate: Any, correction_bias: Any, top_k: int, renormalize: bool, norm_min: float,
                     up_gate_weights: Any, down_weights: Any, quant: Any, shared_up_gate: Any,
                     shared_down: Any) -> Any:
        self.asked += 1
        return self.answer


@pytest.mark.parametrize("bind", [True, False])
def test_a_fusing_backend_answers_and_a_declining_one_falls_back(bind: bool) -> None:
    a = _inputs(np.random.default_rng(1), True)
    marker = paddle.full([T, D], 7.0)
    fusing = _Fusing(marker)
    ops = Ops(make_plugin_manager(cpu, fusing), "fusing", bind=bind)
    assert ops.moe_layer(**a) is marker and fusing.asked == 1
    declining = _Fusing(None)
    ops = Ops(make_plugin_manager(cpu, declining), "declining", bind=bind)
    got = ops.moe_layer(**a).numpy()
    assert declining.asked == 1
    np.testing.assert_array_equal(got, _composed(ops, a).numpy())
