"""Mixture of experts: routing and the routed experts' FFN."""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops.activation import reference_silu_and_mul
from fd_core.ops.linear import widen_for_matmul

__all__ = ["grouped_experts", "reference_moe_experts", "reference_moe_select_experts"]

paddle = import_paddle()
F = paddle.nn.functional


def reference_moe_select_experts(
    router_logits: Any,
    top_k: int,
    correction_bias: Any | None = None,
    renormalize: bool = True,
    norm_min: float = 1e-12,
) -> tuple[Any, Any]:
    """Softmax router; select by ``probs + bias``, weight by ``probs``."""
    probs = F.softmax(router_logits.astype("float32"), axis=-1)  # [T, E]
    scores = probs if correction_bias is None else probs + correction_bias.reshape([1, -1])
    _, ids = paddle.topk(scores, k=top_k, axis=-1)
    weights = paddle.take_along_axis(probs, ids, axis=-1)
    if renormalize:
        weights = weights / paddle.clip(weights.sum(axis=-1, keepdim=True), min=norm_min)
    return weights, ids.astype("int64")


def reference_moe_experts(
    x: Any,
    topk_weights: Any,
    topk_ids: Any,
    up_gate_weights: Any,
    down_weights: Any,
) -> Any:
    """``out[t] = sum_k w[t,k] * down[e] (silu_and_mul(up_gate[e] x[t]))`` with float
    experts (``up_gate_weights [E, D, 2I]``, ``down_weights [E, I, D]``), through
    ``grouped_experts``. 16-bit experts are widened one expert at a time, only those
    that received tokens. (Quantized experts: ``fd_core.quantization.reference``.)"""
    num_experts = int(up_gate_weights.shape[0])

    def up_gate(e: int, h: Any) -> Any:
        return paddle.matmul(h, widen_for_matmul(up_gate_weights[e], h.dtype))

    def down(e: int, h: Any) -> Any:
        return paddle.matmul(h, widen_for_matmul(down_weights[e], h.dtype))

    return grouped_experts(x, topk_weights, topk_ids, num_experts, up_gate, down)


def grouped_experts(
    x: Any, topk_weights: Any, topk_ids: Any, num_experts: int, up_gate: Any, down: Any, act: Any = None,
) -> Any:
    """The routed FFN with the tokens grouped by expert on the host (one
    argsort of ``T*k`` ids): each expert that received tokens runs
    ``down(e, act(up_gate(e, rows)))`` once over all of them (``act``:
    silu-and-mul of ``[gate | up]``, paddle's by default); the outputs are
    weighted and summed back per token. Backends reuse it with their own
    per-expert linears."""
    act = act or reference_silu_and_mul
    num_tokens, top_k = topk_ids.shape
    ids = topk_ids.numpy().reshape(-1)
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=num_experts)
    token_of = paddle.to_tensor((order // top_k).astype(np.int64))
    routed = paddle.gather(x, token_of)  # [T*k, D], grouped by expert
    outputs = []
    start = 0
    for expert in np.nonzero(counts)[0]:
        end = start + int(counts[expert])
        outputs.append(down(int(expert), act(up_gate(int(expert), routed[start:end]))))
        start = end
    expert_out = paddle.concat(outputs, axis=0)
    weights = paddle.gather(topk_weights.reshape([-1]), paddle.to_tensor(order.astype(np.int64)))
    expert_out = expert_out * weights.unsqueeze(-1).astype(expert_out.dtype)
    out = paddle.zeros([num_tokens, x.shape[-1]], dtype=x.dtype)
    return paddle.index_add(out, token_of, 0, expert_out)
