"""A dense pre-norm decoder layer as one op, and its composition from the others.

``DecoderLayerWeights`` describes one layer of the ERNIE 4.5 dense / Llama
family: RMSNorm, fused QKV projection, rotary embedding, paged attention
(GQA), output projection, RMSNorm, fused ``[gate | up]`` projection, SiLU-and-
mul, down projection, with the residual adds folded into the norms. Each
linear weight is an fp32 ``[in, out]`` tensor or a ``QuantizedWeight``.

``compose_decoder_layer`` runs it through the separate kernel hooks, and
``compose_decoder_layers`` a run of such layers: the numerics of the
optional fused hook ``fd_decoder_layers``, and what ``Ops`` runs when no
backend fuses the run. ``self_attention`` is its attention
block, which the model's MoE layers use as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fd_core._paddle import import_paddle
from fd_core.ops.linear import QuantizedWeight

if TYPE_CHECKING:
    from fd_core.backends.base import Ops

__all__ = ["DecoderLayerWeights", "apply_linear", "compose_decoder_layer", "compose_decoder_layers",
           "self_attention"]

paddle = import_paddle()


@dataclass
class DecoderLayerWeights:
    """One dense decoder layer's weights and shape (no biases)."""

    input_norm: Any  # [D]
    post_norm: Any  # [D]
    eps: float
    qkv: Any  # [D, (H + 2 Hkv) Dh], columns [q | k | v]; or a QuantizedWeight
    o: Any  # [H Dh, D]
    up_gate: Any  # [D, 2 I], columns [gate | up]
    down: Any  # [I, D]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float  # attention's softmax scale, usually head_dim ** -0.5
    interleaved_rope: bool = True
    # a backend's derived per-layer data (e.g. repacked weights), by backend
    # name; the model keeps one DecoderLayerWeights per layer while its
    # weights stay the same objects, so this lives as long as they do
    # (not an __init__ argument: dataclasses.replace gives the copy an empty one)
    backend_cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)


def apply_linear(ops: Ops, x: Any, weight: Any) -> Any:
    """``x @ weight`` through ``fd_linear`` (fp32 tensor or QuantizedWeight)."""
    if isinstance(weight, QuantizedWeight):
        return ops.linear(x, None, None, weight)
    return ops.linear(x, weight, None, None)


def self_attention(
    ops: Ops, x: Any, qkv: Any, o: Any, cos_sin: Any, metadata: Any, k_cache: Any, v_cache: Any,
    num_heads: int, num_kv_heads: int, scale: float, interleaved_rope: bool = True,
) -> Any:
    """QKV projection, rotary + cache store, paged attention (decodes, then
    prefill chunks), output projection: ``x [T, D] -> [T, D]``."""
    num_tokens = x.shape[0]
    q, k, v = ops.rope_and_write_kv_cache(
        apply_linear(ops, x, qkv), metadata.positions, cos_sin, interleaved_rope, num_heads, num_kv_heads,
        k_cache, v_cache, metadata.slot_mapping,
    )
    nd = metadata.num_decodes
    parts = []
    if nd:
        decode_q = q if nd == num_tokens else q[:nd]  # a slice is a paddle op: skip it when whole
        parts.append(ops.decode_attention(decode_q, k_cache, v_cache, metadata, scale))
    if nd < num_tokens:
        parts.append(ops.prefill_attention(q[nd:], k[nd:], v[nd:], k_cache, v_cache, metadata, scale))
    out = parts[0] if len(parts) == 1 else paddle.concat(parts, axis=0)
    return apply_linear(ops, out.reshape([num_tokens, q.shape[1] * q.shape[2]]), o)


def compose_decoder_layer(
    ops: Ops, layer: DecoderLayerWeights, hidden: Any, residual: Any | None, cos_sin: Any, metadata: Any,
    k_cache: Any, v_cache: Any,
) -> tuple[Any, Any]:
    """``(hidden, residual)`` after the layer, from the unfused hooks. With
    ``residual`` None (the first layer) the residual stream starts at
    ``hidden``; the layer's own residual add is left to the next norm, so
    the stream is ``hidden + residual`` when read."""
    if residual is None:
        x, residual = ops.rms_norm(hidden, layer.input_norm, layer.eps), hidden
    else:
        x, residual = ops.rms_norm(hidden, layer.input_norm, layer.eps, residual)
    h = self_attention(ops, x, layer.qkv, layer.o, cos_sin, metadata, k_cache, v_cache, layer.num_heads,
                       layer.num_kv_heads, layer.scale, layer.interleaved_rope)
    x, residual = ops.rms_norm(h, layer.post_norm, layer.eps, residual)
    h = apply_linear(ops, ops.silu_and_mul(apply_linear(ops, x, layer.up_gate)), layer.down)
    return h, residual


def compose_decoder_layers(
    ops: Ops, layers: list[DecoderLayerWeights], hidden: Any, residual: Any | None, cos_sin: Any, metadata: Any,
    k_caches: list[Any], v_caches: list[Any],
) -> tuple[Any, Any]:
    """``compose_decoder_layer`` over a run of layers, each with its caches."""
    if not (len(layers) == len(k_caches) == len(v_caches)) or not layers:
        raise ValueError(f"decoder_layers: {len(layers)} layers with {len(k_caches)} k and {len(v_caches)} v "
                         "caches; expected one of each per layer, at least one layer")
    for layer, k_cache, v_cache in zip(layers, k_caches, v_caches):
        hidden, residual = compose_decoder_layer(ops, layer, hidden, residual, cos_sin, metadata, k_cache, v_cache)
    return hidden, residual
