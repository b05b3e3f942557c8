"""Mixture of experts: routing and the routed experts' FFN."""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle

__all__ = ["reference_moe_select_experts", "reference_moe_experts"]

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
    quant: Any = None,
) -> Any:
    """``out[t] = sum_k w[t,k] * down[e] (silu_and_mul(up_gate[e] x[t]))``.

    Tokens are grouped by expert on the host (one argsort of ``T*k`` ids) and
    each expert that received tokens runs one matmul pair over all of them.
    """
    if quant is not None:
        return None
    num_tokens, top_k = topk_ids.shape
    ids = topk_ids.numpy().reshape(-1)
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=up_gate_weights.shape[0])
    token_of = paddle.to_tensor((order // top_k).astype(np.int64))
    routed = paddle.gather(x, token_of)  # [T*k, D], grouped by expert
    outputs = []
    start = 0
    for expert in np.nonzero(counts)[0]:
        end = start + int(counts[expert])
        h = paddle.matmul(routed[start:end], up_gate_weights[int(expert)])
        gate, up = paddle.chunk(h, 2, axis=-1)
        outputs.append(paddle.matmul(F.silu(gate) * up, down_weights[int(expert)]))
        start = end
    expert_out = paddle.concat(outputs, axis=0)
    weights = paddle.gather(topk_weights.reshape([-1]), paddle.to_tensor(order.astype(np.int64)))
    expert_out = expert_out * weights.unsqueeze(-1).astype(expert_out.dtype)
    out = paddle.zeros([num_tokens, x.shape[-1]], dtype=x.dtype)
    return paddle.index_add(out, token_of, 0, expert_out)
