"""``Ops.moe_experts_with_shared``: a backend's fused routed + shared experts
(``fd_moe_layer_experts``) when it answers, else ``moe_experts`` plus the
shared GatedMLP through the unfused hooks, exactly as MoE layers composed it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fd_core.backends import cpu
from fd_core.backends.base import Ops
from fd_core.ops.linear import QuantizedWeight
from fd_core.plugins import hookimpl
from fd_core.plugins.manager import make_plugin_manager
from fd_core.quantization.weights import quantize_weight

paddle = pytest.importorskip("paddle")

T, D, E, INTER, SHARED = 5, 64, 4, 32, 48


def _inputs(rng: np.random.Generator) -> dict[str, Any]:
    def t(*shape: int) -> Any:
        return paddle.to_tensor(rng.standard_normal(shape).astype(np.float32) * 0.1)

    ids = np.stack([rng.permutation(E)[:2] for _ in range(T)]).astype(np.int64)
    return dict(x=t(T, D), topk_weights=paddle.to_tensor(rng.random((T, 2)).astype(np.float32)),
                topk_ids=paddle.to_tensor(ids), up_gate_weights=t(E, D, 2 * INTER), down_weights=t(E, INTER, D),
                quant=None, shared_up_gate=t(D, 2 * SHARED), shared_down=t(SHARED, D))


def _composed(ops: Ops, a: dict[str, Any]) -> Any:
    """Routed sum first, then + the shared GatedMLP (``fd_core.layers.mlp``'s order before the hook)."""
    def linear(x: Any, w: Any) -> Any:
        return ops.linear(x, None, None, w) if isinstance(w, QuantizedWeight) else ops.linear(x, w)

    routed = ops.moe_experts(a["x"], a["topk_weights"], a["topk_ids"], a["up_gate_weights"], a["down_weights"],
                             a["quant"])
    return routed + linear(ops.silu_and_mul(linear(a["x"], a["shared_up_gate"])), a["shared_down"])


@pytest.mark.parametrize("bind", [True, False])
@pytest.mark.parametrize("shared_method", [None, "wint8"])
def test_without_a_fusing_backend_the_ops_compose_the_unfused_hooks(bind: bool, shared_method: str | None) -> None:
    a = _inputs(np.random.default_rng(0))
    if shared_method is not None:
        a["shared_up_gate"] = quantize_weight(shared_method, a["shared_up_gate"])
        a["shared_down"] = quantize_weight(shared_method, a["shared_down"])
    ops = Ops(make_plugin_manager(cpu), "cpu", bind=bind)
    assert ops.implementers("moe_layer_experts") == []  # the reference does not implement it
    got = ops.moe_experts_with_shared(**a).numpy()
    np.testing.assert_array_equal(got, _composed(ops, a).numpy())


class _Fusing:
    """A backend answering ``fd_moe_layer_experts`` when ``answer`` is set."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.asked = answer, 0

    @hookimpl
    def fd_moe_layer_experts(self, x: Any, topk_weights: Any, topk_ids: Any, up_gate_weights: Any,
                             down_weights: Any, quant: Any, shared_up_gate: Any, shared_down: Any) -> Any:
        self.asked += 1
        return self.answer


@pytest.mark.parametrize("bind", [True, False])
def test_a_fusing_backend_answers_and_a_declining_one_falls_back(bind: bool) -> None:
    a = _inputs(np.random.default_rng(1))
    marker = paddle.full([T, D], 7.0)
    fusing = _Fusing(marker)
    ops = Ops(make_plugin_manager(cpu, fusing), "fusing", bind=bind)
    assert ops.moe_experts_with_shared(**a) is marker and fusing.asked == 1
    declining = _Fusing(None)
    ops = Ops(make_plugin_manager(cpu, declining), "declining", bind=bind)
    got = ops.moe_experts_with_shared(**a).numpy()
    assert declining.asked == 1
    np.testing.assert_array_equal(got, _composed(ops, a).numpy())
