"""Quantized routed experts (``fd_moe_experts``) on the native kernels.

The tokens are grouped by expert as in fd-core's reference
(``fd_core.ops.moe.grouped_experts``); each expert that received tokens runs
its up_gate and down projections with the wint8 / wint4 / w8a8 kernels on its
slice of the stacked weight (a view: the contract layout, no repacked copy,
so the experts' memory is not doubled) and SiLU-and-mul natively. The
reference would dequantize each expert's weights on every call. Unquantized
experts return None (paddle's matmuls in the reference are the fast path
there), as do methods without a kernel and non-fp32 / non-CPU inputs.
"""

from __future__ import annotations

from typing import Any

from fd_core.ops.activation import reference_silu_and_mul
from fd_core.ops.moe import grouped_experts
from fd_core.quantization.weights import expert_weight
from fd_x86 import ops as x86_ops
from fd_x86.linear import METHODS, quantized_linear

__all__ = ["moe_experts"]


def moe_experts(x: Any, topk_weights: Any, topk_ids: Any, quant: Any) -> Any:
    """``sum_k w[t, k] * FFN_{ids[t, k]}(x[t])`` for quantized experts, or None."""
    if quant is None:
        return None
    up_q, down_q = quant
    if up_q.method not in METHODS or down_q.method not in METHODS or len(x.shape) != 2 \
            or len(up_q.qweight.shape) != 3 or len(down_q.qweight.shape) != 3 or not x86_ops._host(x):
        return None

    def up_gate(expert: int, rows: Any) -> Any:
        return quantized_linear(rows, expert_weight(up_q, expert), repack=False)

    def down(expert: int, rows: Any) -> Any:
        return quantized_linear(rows, expert_weight(down_q, expert), repack=False)

    def act(h: Any) -> Any:
        out = x86_ops.silu_and_mul(h)
        return out if out is not None else reference_silu_and_mul(h)

    return grouped_experts(x, topk_weights, topk_ids, int(up_q.qweight.shape[0]), up_gate, down, act)
