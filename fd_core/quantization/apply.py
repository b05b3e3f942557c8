"""Quantization as a load-time transform of a model's layers.

Before the weights load, a layer chosen for ``method`` has its float
``Param`` replaced by a ``QuantizedParam`` of the same shape, which quantizes
each tensor as the loader fills it (routed experts: each expert as soon as it
is complete). The layers themselves know nothing of quantization: they read
``weight.data``, a float tensor or a ``QuantizedWeight``.
"""

from __future__ import annotations

from typing import Any

from fd_core.errors import UnsupportedFeatureError
from fd_core.layers.basic import Linear
from fd_core.layers.mlp import MoE
from fd_core.layers.param import Param
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

    Every ``Linear`` reachable from ``model.layers`` (attributes, lists and
    tuples of layer objects, whatever module defines them: plugin models too)
    takes the dense method (attention projections, dense MLPs, shared experts),
    every ``MoE``'s routed experts the MoE method (its router gate stays float),
    ``model.lm_head`` the LM-head method when one is set; embeddings and norms
    stay float. Names (for the log) are the attribute paths, e.g.
    ``layers.3.self_attn.qkv_proj``. A model in which the walk finds no linear
    layer is refused (UnsupportedFeatureError): quantization must never be
    accepted and silently do nothing."""
    group = quantization.group_size
    seen: set[int] = set()
    found = 0
    if quantization.lm_head_method:
        quantize_linear(model.lm_head, quantization.lm_head_method, group, "lm_head")

    def walk(obj: Any, name: str) -> None:
        nonlocal found
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Linear):
            quantize_linear(obj, quantization.dense_method, group, name)
            found += 1
            return
        if isinstance(obj, MoE):
            quantize_experts(obj, quantization.moe_method, group, name + ".experts")
            found += 1
        if isinstance(obj, (list, tuple)):
            for i, item in enumerate(obj):
                if isinstance(item, (list, tuple)) or _is_layer(item):
                    walk(item, f"{name}.{i}")
            return
        for attr, child in getattr(obj, "__dict__", {}).items():
            if isinstance(child, (list, tuple)) or _is_layer(child):
                walk(child, f"{name}.{attr}")

    for i, layer in enumerate(model.layers):
        walk(layer, f"layers.{i}")
    if not found:
        raise UnsupportedFeatureError(
            f"--quantization {quantization.method}: {type(model).__name__} has no Linear or MoE layer "
            "under model.layers to quantize; run it without --quantization")


def _is_layer(obj: Any) -> bool:
    """An object to look inside: an instance of a Python class (a layer, an attention
    block), not a tensor, an array, a parameter, a number or the backend's ops."""
    if isinstance(obj, (Linear, MoE)):
        return True
    if isinstance(obj, Param) or not hasattr(obj, "__dict__") or isinstance(obj, type):
        return False
    module = type(obj).__module__.split(".")[0]
    return module not in ("paddle", "numpy", "builtins", "pluggy") and not type(obj).__module__.startswith(
        ("fd_core.backends", "fd_core.plugins", "fd_core.ops"))
