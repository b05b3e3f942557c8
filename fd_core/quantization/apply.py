"""Quantization as a load-time transform of a model's layers.

Before the weights load, a layer chosen for ``method`` has its float
``Param`` replaced by a ``QuantizedParam`` of the same shape, which quantizes
each tensor as the loader fills it (routed experts: each expert as soon as it
is complete). The layers themselves know nothing of quantization: they read
``weight.data``, a float tensor or a ``QuantizedWeight``.
"""

from __future__ import annotations

from typing import Any

from fd_core.layers.basic import Linear
from fd_core.layers.mlp import MoE
from fd_core.quantization.param import QuantizedParam

__all__ = ["quantize_experts", "quantize_linear", "quantize_model"]


def quantize_linear(linear: Any, method: str, group_size: int, name: str = "") -> None:
    """Store ``linear.weight`` (a ``fd_core.layers.basic.Linear``) quantized with ``method``."""
    linear.weight = QuantizedParam(linear.weight.shape, method, group_size, name)


def quantize_experts(moe: Any, method: str, group_size: int, name: str = "") -> None:
    """Store a ``fd_core.layers.mlp.MoE``'s routed experts quantized with ``method``;
    its router gate (and shared experts, quantized as linears) are left alone."""
    moe.up_gate_proj = QuantizedParam(moe.up_gate_proj.shape, method, group_size, name + ".up_gate_proj")
    moe.down_proj = QuantizedParam(moe.down_proj.shape, method, group_size, name + ".down_proj")


def quantize_model(model: Any, quantization: Any) -> None:
    """Before loading: make ``model``'s layers quantized as ``quantization`` (a
    ``QuantizationConfig`` already resolved for the architecture) says.

    Every ``Linear`` inside ``model.layers`` takes the dense method (attention
    projections, dense MLPs, shared experts), every ``MoE``'s routed experts the
    MoE method (its router gate stays float), ``model.lm_head`` the LM-head
    method when one is set; embeddings and norms stay float. Names (for the
    log) are the attribute paths, e.g. ``layers.3.self_attn.qkv_proj``."""
    group = quantization.group_size
    seen: set[int] = set()
    if quantization.lm_head_method:
        quantize_linear(model.lm_head, quantization.lm_head_method, group, "lm_head")

    def walk(obj: Any, name: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Linear):
            quantize_linear(obj, quantization.dense_method, group, name)
            return
        if isinstance(obj, MoE):
            quantize_experts(obj, quantization.moe_method, group, name + ".experts")
        for attr, child in vars(obj).items():
            if isinstance(child, (Linear, MoE)) or _is_module(child):
                walk(child, f"{name}.{attr}")

    for i, layer in enumerate(model.layers):
        walk(layer, f"layers.{i}")


def _is_module(obj: Any) -> bool:
    """A layer object to look inside (fd_core.layers / fd_core.models classes), not a tensor or ops."""
    module = type(obj).__module__
    return module.startswith(("fd_core.layers.", "fd_core.models.")) and hasattr(obj, "__dict__")
