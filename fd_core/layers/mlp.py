"""Gated MLP (SwiGLU) and the mixture-of-experts block."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fd_core.layers.basic import Linear
from fd_core.layers.param import Param
from fd_core.ops.linear import QuantizedWeight

if TYPE_CHECKING:
    from fd_core.backends.base import Ops
    from fd_core.ops.decoder import MoELayerWeights

__all__ = ["GatedMLP", "MoE"]


class GatedMLP:
    """``down(silu(gate(x)) * up(x))`` with ``up_gate_proj [D, 2I] = [gate | up]``."""

    def __init__(self, ops: Ops, hidden_size: int, intermediate_size: int) -> None:
        self.ops = ops
        self.up_gate_proj = Linear(ops, hidden_size, 2 * intermediate_size)
        self.down_proj = Linear(ops, intermediate_size, hidden_size)

    def __call__(self, x: Any) -> Any:
        return self.down_proj(self.ops.silu_and_mul(self.up_gate_proj(x)))


class MoE:
    """Routed experts (softmax router, top-k, selection-only correction bias,
    renormalised weights) plus optional shared experts, summed."""

    def __init__(
        self, ops: Ops, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
        num_shared_experts: int, norm_min: float, use_correction_bias: bool,
    ) -> None:
        self.ops = ops
        self.top_k = top_k
        self.norm_min = norm_min
        # router [D, E] and its bias: fp32 whatever --dtype (top-k is precision sensitive; HF keeps it fp32)
        self.gate = Param((hidden_size, num_experts), pinned=True)
        self.correction_bias = Param((num_experts,), pinned=True) if use_correction_bias else None
        self.up_gate_proj = Param((num_experts, hidden_size, 2 * intermediate_size))
        self.down_proj = Param((num_experts, intermediate_size, hidden_size))
        self.shared_experts = (
            GatedMLP(ops, hidden_size, intermediate_size * num_shared_experts)
            if num_shared_experts else None
        )

    @property
    def expert_quant(self) -> tuple[QuantizedWeight, QuantizedWeight] | None:
        """``(up_gate, down)`` stacked over experts when quantized, else None."""
        up_gate, down = self.up_gate_proj.data, self.down_proj.data
        return (up_gate, down) if isinstance(up_gate, QuantizedWeight) else None

    def layer_weights(self) -> MoELayerWeights | None:
        """The block as ``Ops.moe_layer`` (and a fused decoder-layer run) takes
        it, or None where a subclass runs its own ``__call__`` (expert or
        tensor parallelism), which a fused run must not bypass."""
        if type(self).__call__ is not MoE.__call__:
            return None
        return self._weights()

    def _weights(self) -> MoELayerWeights:
        from fd_core.ops.decoder import MoELayerWeights  # paddle, so not at import

        bias = self.correction_bias.data if self.correction_bias is not None else None
        quant = self.expert_quant
        up_gate, down = (None, None) if quant is not None else (self.up_gate_proj.data, self.down_proj.data)
        shared = self.shared_experts
        return MoELayerWeights(
            self.gate.data, bias, self.top_k, True, self.norm_min, up_gate, down, quant,
            shared.up_gate_proj.weight.data if shared is not None else None,
            shared.down_proj.weight.data if shared is not None else None,
        )

    def __call__(self, x: Any) -> Any:
        # router, routing, routed and shared experts: one backend call where it has one
        # (Ops.moe_layer composes the per-op hooks otherwise, the same numerics)
        return self._weights().run(self.ops, x)
