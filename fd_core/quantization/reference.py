"""The reference numerics of quantized layers, as the CPU reference backend runs them.

A quantized linear layer is its method's ``linear`` (``methods``: dequantize,
then an fp32 matmul; w8a8 quantizes activations per token) plus the bias in
fp32; quantized routed experts run ``fd_core.ops.moe.grouped_experts`` with
each expert's slice of the stacked weights. None for a method without
reference numerics (the op is then "not provided", naming the method).
"""

from __future__ import annotations

from typing import Any

from fd_core.ops.linear import QuantizedWeight, upcast
from fd_core.ops.moe import grouped_experts
from fd_core.quantization.methods import registry

__all__ = ["quantized_linear", "quantized_moe_experts"]


def _linear_of(quant: QuantizedWeight) -> Any:
    method = registry.find(quant.method)
    return None if method is None else method.linear


def quantized_linear(x: Any, quant: QuantizedWeight, bias: Any | None = None) -> Any:
    """``x [T, in] @ W + bias`` for the quantized ``W``."""
    linear = _linear_of(quant)
    if linear is None:
        return None
    out = linear(x, quant)
    if bias is not None:
        out = out + upcast(bias, out.dtype)
    return out


def quantized_moe_experts(x: Any, topk_weights: Any, topk_ids: Any,
                          quant: tuple[QuantizedWeight, QuantizedWeight]) -> Any:
    """The routed FFN over ``quant = (up_gate, down)``, two ``QuantizedWeight``s stacked
    over a leading expert axis (layouts in ``fd_core.quantization``); each expert
    that received tokens dequantizes only its own slice."""
    up_q, down_q = quant
    up_linear, down_linear = _linear_of(up_q), _linear_of(down_q)
    if up_linear is None or down_linear is None:
        return None

    def up_gate(e: int, h: Any) -> Any:
        return up_linear(h, up_q.expert(e))

    def down(e: int, h: Any) -> Any:
        return down_linear(h, down_q.expert(e))

    return grouped_experts(x, topk_weights, topk_ids, int(up_q.qweight.shape[0]), up_gate, down)
