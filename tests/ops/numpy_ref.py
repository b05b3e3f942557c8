"""Independent numpy definitions of the kernel hooks, for testing the CPU reference.

Written from the hook docstrings in ``fd_core.plugins.hookspecs`` (and the
sampling module docstring), not from the paddle code: plain loops and float64
where that makes the definition obvious. Nothing here is fast; shapes in the
tests are small.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "causal_attention",
    "kept_tokens",
    "moe_experts",
    "moe_select_experts",
    "rms_norm",
    "rope_table",
    "rotary_embedding",
    "sample_row",
    "silu",
    "silu_and_mul",
    "softmax",
]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def silu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / (1.0 + np.exp(-x))


# ------------------------------------------------------------------ norm


def rms_norm(x, weight, eps, residual=None):
    """``x / sqrt(mean(x^2) + eps) * weight``; with residual, normalise the sum
    and also return it."""
    x = np.asarray(x, dtype=np.float64)
    if residual is not None:
        x = x + np.asarray(residual, dtype=np.float64)
    rms = np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps)
    normed = x / rms * np.asarray(weight, dtype=np.float64)
    return (normed, x) if residual is not None else normed


# ------------------------------------------------------------------ rope


def rope_table(head_dim: int, max_position: int, theta: float) -> np.ndarray:
    """``[max_position, head_dim]`` = concat(cos, sin) of frequency
    ``theta ** (-2i / head_dim)`` for i < head_dim/2, in float64."""
    inv_freq = np.array([theta ** (-2.0 * i / head_dim) for i in range(head_dim // 2)])
    angles = np.outer(np.arange(max_position, dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=-1)


def rotary_embedding(x, positions, cos_sin, interleaved: bool) -> np.ndarray:
    """Rotate every head of ``x [T, H, Dh]``. Pair i is ``(x[2i], x[2i+1])``
    when interleaved, else ``(x[i], x[i + Dh/2])``; it turns by the angle of
    frequency i at the token's position."""
    x = np.asarray(x, dtype=np.float64)
    table = np.asarray(cos_sin, dtype=np.float64)
    num_tokens, num_heads, head_dim = x.shape
    half = head_dim // 2
    out = np.empty_like(x)
    for t in range(num_tokens):
        row = table[int(positions[t])]
        for i in range(half):
            c, s = row[i], row[half + i]
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
            x1, x2 = x[t, :, a], x[t, :, b]
            out[t, :, a] = x1 * c - x2 * s
            out[t, :, b] = x1 * s + x2 * c
    return out


# ------------------------------------------------------------ activation


def silu_and_mul(x) -> np.ndarray:
    """``[gate | up]`` along the last axis -> ``silu(gate) * up``."""
    x = np.asarray(x, dtype=np.float64)
    inter = x.shape[-1] // 2
    return silu(x[..., :inter]) * x[..., inter:]


# ------------------------------------------------------------- attention


def causal_attention(q, k_hist, v_hist, scale: float) -> np.ndarray:
    """Queries ``q [Q, H, Dh]`` are the last Q tokens of a sequence whose
    full K/V history is ``k_hist, v_hist [S, Hkv, Dh]``; query i (position
    ``S - Q + i``) sees keys 0..its position. Head h uses KV head
    ``h // (H // Hkv)``. Returns ``[Q, H, Dh]``."""
    q = np.asarray(q, dtype=np.float64)
    k_hist = np.asarray(k_hist, dtype=np.float64)
    v_hist = np.asarray(v_hist, dtype=np.float64)
    num_q, num_heads, head_dim = q.shape
    seq_len, num_kv, _ = k_hist.shape
    group = num_heads // num_kv
    out = np.zeros((num_q, num_heads, head_dim))
    for i in range(num_q):
        visible = seq_len - num_q + i + 1
        for h in range(num_heads):
            kv = h // group
            scores = k_hist[:visible, kv] @ q[i, h] * scale  # [visible]
            weights = softmax(scores)
            out[i, h] = weights @ v_hist[:visible, kv]
    return out


# ------------------------------------------------------------------- moe


def moe_select_experts(logits, top_k, correction_bias, renormalize, norm_min):
    """Per token: probs = softmax(logits); choose the top_k experts by
    probs + bias; weights are the chosen experts' probs, divided by
    max(their sum, norm_min) when renormalising. Ids in selection order."""
    logits = np.asarray(logits, dtype=np.float64)
    weights = np.zeros((logits.shape[0], top_k))
    ids = np.zeros((logits.shape[0], top_k), dtype=np.int64)
    for t, row in enumerate(logits):
        probs = softmax(row)
        score = probs if correction_bias is None else probs + np.asarray(correction_bias, np.float64)
        chosen = sorted(range(len(row)), key=lambda e: -score[e])[:top_k]
        ids[t] = chosen
        weights[t] = probs[chosen]
        if renormalize:
            weights[t] /= max(weights[t].sum(), norm_min)
    return weights, ids


def moe_experts(x, topk_weights, topk_ids, up_gate, down) -> np.ndarray:
    """``out[t] = sum_k w[t,k] * silu_and_mul(x[t] @ up_gate[e]) @ down[e]``."""
    x = np.asarray(x, dtype=np.float64)
    up_gate = np.asarray(up_gate, dtype=np.float64)
    down = np.asarray(down, dtype=np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            out[t] += float(topk_weights[t, j]) * (silu_and_mul(x[t] @ up_gate[e]) @ down[e])
    return out


# -------------------------------------------------------------- sampling


def kept_tokens(logits, temperature, top_k, top_p, min_p):
    """The tokens a sampled row may emit, most likely first, and their probs.

    probs = softmax(logits / T); min-p drops p < min_p * max p; top-k keeps
    the k most likely of the rest (0 = off); top-p walks the rest, most
    likely first, keeping tokens until the renormalised mass reaches top_p
    (the crossing token is kept)."""
    probs = softmax(np.asarray(logits, dtype=np.float64) / temperature)
    order = sorted(range(len(probs)), key=lambda t: -probs[t])
    kept = [t for t in order if probs[t] >= min_p * probs[order[0]]]
    if top_k > 0:
        kept = kept[:top_k]
    total = sum(probs[t] for t in kept)
    chosen, mass = [], 0.0
    for t in kept:
        chosen.append(t)
        mass += probs[t] / total
        if mass >= top_p:
            break
    return chosen, probs[chosen]


def sample_row(logits, temperature, top_k, top_p, min_p, u) -> int:
    """Greedy argmax at temperature 0; else the inverse CDF of the kept,
    renormalised distribution (most likely first) at ``u``."""
    if temperature == 0:
        return int(np.argmax(logits))
    tokens, probs = kept_tokens(logits, temperature, top_k, top_p, min_p)
    cdf = np.cumsum(probs) / probs.sum()
    for token, c in zip(tokens, cdf):
        if u < c:
            return int(token)
    return int(tokens[-1])
