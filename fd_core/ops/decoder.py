"""A generic pre-norm decoder layer as one op, and its composition from the others.

``DecoderLayerWeights`` describes one dense layer of the Llama family, which
ERNIE 4.5 (dense layers), Qwen3 and Qwen2 are members of: RMSNorm, fused QKV
projection (optional bias), optional per-head RMSNorm of q and k (Qwen3),
rotary embedding (interleaved or half-split), paged attention (GQA), output
projection (optional bias), RMSNorm, fused ``[gate | up]`` projection, SiLU-
and-mul, down projection, with the residual adds folded into the norms.
Each linear weight is an ``[in, out]`` tensor (any ``--dtype``) or a
``QuantizedWeight``. A model family whose layer fits this shape gets every
backend's fused layer kernel by describing its layers, with no plugin change;
a field a backend's kernel lacks (a bias, the q/k norms) makes that backend
decline and the separate ops run.

A layer whose MLP is something else (a MoE layer's routed experts) is
described *attention only*: ``up_gate`` and ``down`` None. Such a layer
ends a run (it is its last layer, or the whole run), and the run returns
``(x, residual)`` where ``residual`` is the residual stream after the
attention block's add (``o_proj out + residual in``) and ``x`` is that
stream RMS-normed with ``post_norm``: the input the MLP takes. The model
then continues with ``(mlp(x), residual)``, as after any layer.

A MoE layer may instead carry its MoE block (``moe``: a ``MoELayerWeights``,
``fd_moe_layer``'s arguments), with ``up_gate`` and ``down`` None: the layer
then runs whole (attention, the post-attention norm, the MoE block on the
normed stream) and may sit anywhere in a run, so a MoE model's whole layer
stack is one run. Only plugins that declare ``FD_DECODER_LAYERS_MOE = True``
are asked for such runs; for the rest ``Ops.decoder_layers`` splits the run
at each MoE layer into the runs above (its attention half last) and calls
``Ops.moe_layer`` between them, the same numerics.

A run may end with the model's head (``head``: a ``DecoderHead``, the final
RMSNorm and the LM head): it then returns the logits of every row instead
of ``(hidden, residual)``, so a decode step's whole forward after the
embedding is one call. Only plugins that declare ``FD_DECODER_LAYERS_HEAD =
True`` are asked for such runs (both flags for a MoE run with its blocks);
for the rest ``Ops.decoder_layers`` runs the layers and then
``DecoderHead.run``, the same numerics. Such a run may also start at the
model's token embedding (``hidden``: a ``DecoderEmbedding``, the table and
the step's ids, ``residual`` None), so a decode step's whole forward is one
call: only plugins that also declare ``FD_DECODER_LAYERS_EMBEDDING = True``
see one; for the rest ``Ops`` takes the rows first
(``DecoderEmbedding.run``).

``compose_decoder_layer`` runs it through the separate kernel hooks, and
``compose_decoder_layers`` a run of such layers: the numerics of the
optional fused hook ``fd_decoder_layers``, and what ``Ops`` runs when no
backend fuses the run. ``self_attention`` is its attention block.

A layer of an offline W4A8C8 checkpoint carries its static per-channel KV
scales (``kv_scales``, FastDeploy's C8; ``fd_core.ops.kv_dtype``): its k and
v are written into an ``int8_static`` pool pre-scaled by ``127 / S``, and q
and the attention output are scaled by ``S / 127``, around the unchanged
int8 attention kernels. Such a layer is not ``plain``, so a fused kernel that
does not know the field declines and the composition runs.

The description carries no backend state. A backend that derives data from
it keys that data by content (``DecoderLayerWeights.key``,
``fd_core.ops.content_key``), so a replaced or rewritten weight is seen.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fd_core._paddle import import_paddle
from fd_core.ops.content_key import tensor_key, weight_key
from fd_core.ops.embedding import embed
from fd_core.ops.kv_dtype import (
    STATIC_KV_DTYPES,
    StaticKVScales,
    static_quantize_input,
    static_scale_output,
    static_scale_queries,
)
from fd_core.ops.linear import QuantizedWeight

if TYPE_CHECKING:
    from fd_core.backends.base import Ops

__all__ = ["DecoderEmbedding", "DecoderHead", "DecoderLayerWeights", "MoELayerWeights", "apply_linear", "compose_decoder_layer", "compose_decoder_layers",
           "self_attention"]

paddle = import_paddle()


@dataclass(eq=False)
class MoELayerWeights:
    """A MoE block after its norm as ``fd_moe_layer`` takes it (router, routing,
    routed experts, shared expert): see ``Ops.moe_layer``."""

    gate: Any  # [D, E] fp32 router
    correction_bias: Any | None  # [E] fp32 (selection only) or None
    top_k: int
    renormalize: bool
    norm_min: float
    up_gate_weights: Any | None  # [E, D, 2I] when unquantized, else None (``quant``)
    down_weights: Any | None  # [E, I, D] when unquantized, else None
    quant: Any  # (up_gate, down) stacked QuantizedWeight, or None
    shared_up_gate: Any = None  # the shared expert's [D, 2Is] weight / QuantizedWeight, or None
    shared_down: Any = None

    def key(self) -> Hashable:
        """The block's content key (``fd_core.ops.content_key``)."""
        quant = self.quant if self.quant is not None else (None, None)
        return (self.top_k, self.renormalize, self.norm_min, tensor_key(self.gate),
                None if self.correction_bias is None else tensor_key(self.correction_bias),
                *(weight_key(w) for w in (self.up_gate_weights, self.down_weights, *quant, self.shared_up_gate,
                                          self.shared_down)))

    def run(self, ops: Ops, x: Any) -> Any:
        """``Ops.moe_layer`` on ``x``."""
        return ops.moe_layer(x, self.gate, self.correction_bias, self.top_k, self.renormalize, self.norm_min,
                             self.up_gate_weights, self.down_weights, self.quant, self.shared_up_gate,
                             self.shared_down)


@dataclass(eq=False)
class DecoderEmbedding:
    """The model's token embedding before a run's first layer: the stream
    starts as ``table[ids]`` in fp32 (``fd_core.ops.embedding.embed``)."""

    table: Any  # [V, D] any --dtype; a tied float head's table is its [D, V] weight seen transposed
    ids: Any  # [T] int64

    def run(self) -> Any:
        """The rows ``[T, D]`` fp32, as the model's own embedding takes them."""
        return embed(self.table, self.ids)


@dataclass(eq=False)
class DecoderHead:
    """The model's final RMSNorm and LM head after a run's last layer: logits
    ``[T, V]`` of ``norm(hidden + residual) @ weight``."""

    norm: Any  # [D] (fp32 where the activations are: RMSNorm's widened copy of a 16-bit weight)
    eps: float
    weight: Any  # [D, V] tensor or a 2-D QuantizedWeight

    def key(self) -> Hashable:
        """The head's content key (``fd_core.ops.content_key``)."""
        return (self.eps, tensor_key(self.norm), weight_key(self.weight))

    def run(self, ops: Ops, hidden: Any, residual: Any) -> Any:
        """The logits through the separate hooks: ``fd_rms_norm``, then ``fd_linear``."""
        x, _ = ops.rms_norm(hidden, self.norm, self.eps, residual)
        return apply_linear(ops, x, self.weight)


@dataclass(eq=False)
class DecoderSampling:
    """How the rows of a multi-step run draw their tokens (``fd_decoder_steps``): per row, the arguments
    ``fd_sample`` takes, and each step's uniforms. Host tensors."""

    temperature: Any  # [T] fp32; 0: the row is greedy (the argmax)
    top_k: Any  # [T] int64; 0: off
    top_p: Any  # [T] fp32; 1: off
    min_p: Any  # [T] fp32; 0: off
    uniforms: Any  # [steps, T, R] fp32: step s draws row t's token with uniforms[s, t]
    method: str  # "sort" or "rejection", as fd_sample's


@dataclass(eq=False)
class DecoderLayerWeights:
    """One pre-norm decoder layer's weights and shape: a dense layer, or
    with ``up_gate`` and ``down`` None its attention half only (see the
    module doc)."""

    input_norm: Any  # [D]
    post_norm: Any  # [D]
    eps: float
    qkv: Any  # [D, (H + 2 Hkv) Dh], columns [q | k | v]; or a QuantizedWeight
    o: Any  # [H Dh, D]
    up_gate: Any  # [D, 2 I], columns [gate | up]; None: attention only (with down)
    down: Any  # [I, D]; None: attention only (with up_gate)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float  # attention's softmax scale, usually head_dim ** -0.5
    interleaved_rope: bool = True  # rotary pairs (x[2i], x[2i+1]); False: (x[i], x[i + Dh/2])
    q_norm: Any | None = None  # [Dh]: RMSNorm of each query head before the rotary (same eps)
    k_norm: Any | None = None  # [Dh]: of each key head
    qkv_bias: Any | None = None  # [(H + 2 Hkv) Dh]
    o_bias: Any | None = None  # [D]
    kv_scales: StaticKVScales | None = None  # static per-channel KV scales (an int8_static pool)
    moe: MoELayerWeights | None = None  # a whole MoE layer (up_gate / down None): its MoE block

    def key(self) -> Hashable:
        """The layer's content key: its shape and every weight's
        ``fd_core.ops.content_key`` (changes when a weight is replaced or
        written in place through paddle)."""
        return (self.eps, self.num_heads, self.num_kv_heads, self.head_dim, self.scale, self.interleaved_rope,
                *(tensor_key(t) for t in (self.input_norm, self.post_norm, self.q_norm, self.k_norm,
                                          self.qkv_bias, self.o_bias)),
                *((None,) if self.kv_scales is None else (tensor_key(self.kv_scales.k), tensor_key(self.kv_scales.v))),
                *(weight_key(w) for w in (self.qkv, self.o, self.up_gate, self.down)),
                *(() if self.moe is None else (self.moe.key(),)))

    @property
    def attention_only(self) -> bool:
        """No MLP (``up_gate`` and ``down`` None, no ``moe``): the run stops
        after the post-attention norm. One of the two None, or a ``moe`` beside
        them, is an error."""
        if (self.up_gate is None) != (self.down is None):
            raise ValueError("DecoderLayerWeights: up_gate and down must both be set (a dense layer) or both "
                             f"None (attention only); got up_gate {'None' if self.up_gate is None else 'set'}, "
                             f"down {'None' if self.down is None else 'set'}")
        if self.moe is not None and self.up_gate is not None:
            raise ValueError("DecoderLayerWeights: a MoE layer (moe set) has no up_gate / down; got both")
        return self.up_gate is None and self.moe is None

    def attention_half(self) -> DecoderLayerWeights:
        """This layer without its MoE block: attention only (a dense or
        attention-only layer: itself)."""
        return self if self.moe is None else replace(self, moe=None)

    @property
    def plain(self) -> bool:
        """No q/k norms, no biases, no static KV scales: the ERNIE 4.5 / Llama layer."""
        return (self.q_norm is None and self.k_norm is None and self.qkv_bias is None and self.o_bias is None
                and self.kv_scales is None)


def apply_linear(ops: Ops, x: Any, weight: Any, bias: Any | None = None) -> Any:
    """``x @ weight (+ bias)`` through ``fd_linear`` (tensor or QuantizedWeight)."""
    if isinstance(weight, QuantizedWeight):
        return ops.linear(x, None, bias, weight)
    return ops.linear(x, weight, bias, None)


def self_attention(
    ops: Ops, x: Any, qkv: Any, o: Any, cos_sin: Any, metadata: Any, k_cache: Any, v_cache: Any,
    num_heads: int, num_kv_heads: int, scale: float, interleaved_rope: bool = True, *,
    q_norm: Any | None = None, k_norm: Any | None = None, eps: float = 1e-6,
    qkv_bias: Any | None = None, o_bias: Any | None = None, kv_scales: StaticKVScales | None = None,
) -> Any:
    """QKV projection, (q/k norms,) rotary + cache store, paged attention
    (decodes, then prefill chunks), output projection: ``x [T, D] -> [T, D]``.
    With ``kv_scales`` (the pools must be ``int8_static``) k / v are stored
    pre-scaled and q / the output are scaled (``fd_core.ops.kv_dtype``)."""
    num_tokens = x.shape[0]
    projected = apply_linear(ops, x, qkv, qkv_bias)
    static = _static_scales(k_cache, kv_scales)
    if static is not None:
        q, k, v = _normed_qkv(ops, projected, num_heads, num_kv_heads, q_norm, k_norm, eps)
        q, k = ops.rotary_embedding(q, k, metadata.positions, cos_sin, interleaved_rope)
        k, v = static_quantize_input(k, v, static)  # what the cache rounds to codes: prefill sees these
        ops.write_kv_cache(k, v, k_cache, v_cache, metadata.slot_mapping)
        q = static_scale_queries(q, static, num_kv_heads)  # fp32
    elif q_norm is None and k_norm is None:
        q, k, v = ops.rope_and_write_kv_cache(
            projected, metadata.positions, cos_sin, interleaved_rope, num_heads, num_kv_heads,
            k_cache, v_cache, metadata.slot_mapping,
        )
    else:
        q, k, v = _normed_qkv(ops, projected, num_heads, num_kv_heads, q_norm, k_norm, eps)
        q, k = ops.rotary_embedding(q, k, metadata.positions, cos_sin, interleaved_rope)
        ops.write_kv_cache(k, v, k_cache, v_cache, metadata.slot_mapping)
    nd = metadata.num_decodes
    parts = []
    if nd:
        decode_q = q if nd == num_tokens else q[:nd]  # a slice is a paddle op: skip it when whole
        parts.append(ops.decode_attention(decode_q, k_cache, v_cache, metadata, scale))
    if nd < num_tokens:
        parts.append(ops.prefill_attention(q[nd:], k[nd:], v[nd:], k_cache, v_cache, metadata, scale))
    out = parts[0] if len(parts) == 1 else paddle.concat(parts, axis=0)
    if static is not None:
        out = static_scale_output(out, static, num_kv_heads)
    return apply_linear(ops, out.reshape([num_tokens, q.shape[1] * q.shape[2]]), o, o_bias)


def _static_scales(k_cache: Any, kv_scales: StaticKVScales | None) -> StaticKVScales | None:
    """``kv_scales`` when the pool is ``int8_static``; None for a float pool
    (the scales are not needed). Raises when an ``int8_static`` pool has no
    scales, or scales meet a dynamic 8-bit pool (they would go unused)."""
    kv_dtype = getattr(k_cache, "kv_dtype", None)  # a QuantizedKV's; None: a float pool
    if kv_dtype in STATIC_KV_DTYPES:
        if kv_scales is None:
            raise ValueError(f"a {kv_dtype} KV cache needs the layer's static per-channel KV scales (an offline "
                             "W4A8C8 checkpoint's cachek/cachev_matmul.activation_scale); this layer has none, so it needs "
                             "a KV pool of its own (dynamic int8 or float), as the MTP block gets")
        return kv_scales
    if kv_scales is not None and kv_dtype is not None:
        raise ValueError(f"this layer has static per-channel KV scales but its KV cache is {kv_dtype} (dynamic "
                         "scales): static scales go with an int8_static cache only")
    return None


def _normed_qkv(ops: Ops, qkv: Any, num_heads: int, num_kv_heads: int, q_norm: Any | None, k_norm: Any | None,
                eps: float) -> tuple[Any, Any, Any]:
    """Split ``qkv [T, (H + 2 Hkv) Dh]`` into heads, each q / k head
    RMS-normed over its Dh (every head's row is one row of the norm)."""
    tokens = qkv.shape[0]
    head_dim = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    q, k, v = paddle.split(qkv, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], axis=-1)
    if q_norm is not None:
        q = ops.rms_norm(q.reshape([-1, head_dim]), q_norm, eps)
    if k_norm is not None:
        k = ops.rms_norm(k.reshape([-1, head_dim]), k_norm, eps)
    return (q.reshape([tokens, num_heads, head_dim]), k.reshape([tokens, num_kv_heads, head_dim]),
            v.reshape([tokens, num_kv_heads, head_dim]))


def compose_decoder_layer(
    ops: Ops, layer: DecoderLayerWeights, hidden: Any, residual: Any | None, cos_sin: Any, metadata: Any,
    k_cache: Any, v_cache: Any,
) -> tuple[Any, Any]:
    """``(hidden, residual)`` after the layer, from the unfused hooks. With
    ``residual`` None (the first layer) the residual stream starts at
    ``hidden``; the layer's own residual add is left to the next norm, so
    the stream is ``hidden + residual`` when read. An attention-only layer
    returns ``(x, residual)``: the post-attention-normed stream and the
    stream itself (see the module doc); a MoE layer (``moe``) runs its MoE
    block on the normed stream."""
    if residual is None:
        x, residual = ops.rms_norm(hidden, layer.input_norm, layer.eps), hidden
    else:
        x, residual = ops.rms_norm(hidden, layer.input_norm, layer.eps, residual)
    h = self_attention(ops, x, layer.qkv, layer.o, cos_sin, metadata, k_cache, v_cache, layer.num_heads,
                       layer.num_kv_heads, layer.scale, layer.interleaved_rope, q_norm=layer.q_norm,
                       k_norm=layer.k_norm, eps=layer.eps, qkv_bias=layer.qkv_bias, o_bias=layer.o_bias,
                       kv_scales=layer.kv_scales)
    x, residual = ops.rms_norm(h, layer.post_norm, layer.eps, residual)
    if layer.moe is not None:
        return layer.moe.run(ops, x), residual
    if layer.attention_only:
        return x, residual
    h = apply_linear(ops, ops.silu_and_mul(apply_linear(ops, x, layer.up_gate)), layer.down)
    return h, residual


def compose_decoder_layers(
    ops: Ops, layers: list[DecoderLayerWeights], hidden: Any, residual: Any | None, cos_sin: Any, metadata: Any,
    k_caches: list[Any], v_caches: list[Any],
) -> tuple[Any, Any]:
    """``compose_decoder_layer`` over a run of layers, each with its caches
    (an attention-only layer only last)."""
    if not (len(layers) == len(k_caches) == len(v_caches)) or not layers:
        raise ValueError(f"decoder_layers: {len(layers)} layers with {len(k_caches)} k and {len(v_caches)} v "
                         "caches; expected one of each per layer, at least one layer")
    inner = [i for i, layer in enumerate(layers[:-1]) if layer.attention_only]
    if inner:
        raise ValueError(f"decoder_layers: layer {inner[0]} of a run of {len(layers)} is attention only (no "
                         "up_gate / down); only a run's last layer may be")
    for layer, k_cache, v_cache in zip(layers, k_caches, v_caches):
        hidden, residual = compose_decoder_layer(ops, layer, hidden, residual, cos_sin, metadata, k_cache, v_cache)
    return hidden, residual
