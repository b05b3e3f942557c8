"""Quantization as a load-time transform of a model's layers.

Before the weights load, a layer chosen for ``method`` has its float
``Param`` replaced by a ``QuantizedParam`` of the same shape, which quantizes
each tensor as the loader fills it (routed experts: each expert as soon as it
is complete). The layers themselves know nothing of quantization: they read
``weight.data``, a float tensor or a ``QuantizedWeight``.
"""

from __future__ import annotations

from typing import Any

from fd_core.quantization.param import QuantizedParam

__all__ = ["quantize_experts", "quantize_linear"]


def quantize_linear(linear: Any, method: str, group_size: int, name: str = "") -> None:
    """Store ``linear.weight`` (a ``fd_core.layers.basic.Linear``) quantized with ``method``."""
    linear.weight = QuantizedParam(linear.weight.shape, method, group_size, name)


def quantize_experts(moe: Any, method: str, group_size: int, name: str = "") -> None:
    """Store a ``fd_core.layers.mlp.MoE``'s routed experts quantized with ``method``;
    its router gate (and shared experts, quantized as linears) are left alone."""
    moe.up_gate_proj = QuantizedParam(moe.up_gate_proj.shape, method, group_size, name + ".up_gate_proj")
    moe.down_proj = QuantizedParam(moe.down_proj.shape, method, group_size, name + ".down_proj")
