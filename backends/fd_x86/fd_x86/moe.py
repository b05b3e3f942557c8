"""Quantized routed experts (``fd_moe_experts``) and routing
(``fd_moe_select_experts``) on the native kernels.

``fd_x86_moe_experts`` (``csrc/x86_moe_op.cc``) runs a whole MoE layer's
routed experts in one call: the tokens grouped by expert, each selected
expert's up_gate, SiLU-and-mul, down and the weighted combine, with the
wint8 / wint4 / w8a8 contract-layout kernels on its slice of the stacked
weight (read in place: no repacked copy, so the experts' memory is not
doubled; each selected expert read once per call); wint4 experts whose
input width and group size are multiples of 128 run a lookup-table kernel
(``csrc/kernels_moe_avx512.cc``); the offline checkpoints' w4a8_static and
wint2 experts run their own kernels in the same op (``fd_x86.offline``;
AVX-512 VNNI, else None and the reference answers), and so do ``w4a8``
experts and shared experts (int4 codes against per-token int8 activations,
``csrc/kernels_w4a8_avx512.cc``; input widths and groups multiples of 128,
else the reference answers). Before it, a decode step of the mid-size
MoE spent ~0.3-0.4 ms per MoE layer in Python, gathers and scatters around
the per-expert kernel calls (``benchmarks/moe_decode.py --profile``); the op
made the step 1.35-1.55x faster at B = 1 and 8 (1 thread, README).
``FD_X86_MOE_NATIVE=0`` turns the op off: the per-expert path below
(fd-core's ``grouped_experts`` over ``fd_x86.linear``) runs instead, as
before (A/B comparisons). Unquantized experts return None (paddle's matmuls
in the reference are the fast path there), as do methods without a kernel
and non-fp32 / non-CPU inputs.

``moe_layer_experts`` (``fd_moe_layer_experts``) runs the same op with the
layer's shared expert as one more expert of every token, weight 1, added
after the routed sum (``fd_x86_moe_experts_shared``): at B = 1 that saves
the shared MLP's ~4 Python-dispatched ops per MoE layer.

``moe_layer`` (``fd_moe_layer``) is the whole layer after its norm in one
native call (``fd_x86_moe_layer``, ``csrc/x86_moe_layer_op.cc``): the
router matmul, the routing below and the routed + shared experts. What a
layer's call needs (checks, the op's tensor and attribute lists) is worked
out once and kept on its stacked up_gate weight (``backend_cache``), checked
by identity on later calls: nothing is derived from the weights' values,
so writes into them need no invalidation. ``FD_X86_MOE_LAYER=0`` turns
only this op off (A/B comparisons). With ``FD_X86_PREFILL_INT8_ACT=1``
(``fd_x86.linear``'s opt-in) calls of at least ``PREFILL_INT8_MIN_ROWS``
tokens run their wint8 experts and shared expert on int8 activations (w8a8's
kernel on the same weights), and their wint4 ones too (w4a8's kernel on the
same weights, where it takes them: VNNI, inputs and groups multiples of 128).

``select_experts`` is fd-core's reference routing
(``fd_core.ops.moe.reference_moe_select_experts``: softmax, selection by
``probs + correction_bias``, weights from ``probs``, renormalised with
``norm_min``) in one op instead of ~8 paddle calls (~0.3 ms per layer at
batch 1).
"""

from __future__ import annotations

import os
from typing import Any

from fd_core.backends.cpu import num_threads
from fd_core.ops.activation import reference_silu_and_mul
from fd_core.ops.linear import QuantizedWeight
from fd_core.ops.moe import grouped_experts
from fd_core.quantization.weights import expert_weight
from fd_x86 import ops as x86_ops
from fd_x86.build import load_ops
from fd_x86.fp8 import METHOD as FP8
from fd_x86.fp8 import available as fp8_available
from fd_x86.fp8 import expert_block_fp8_linear
from fd_x86.linear import (
    METHODS,
    PREFILL_INT8_MIN_ROWS,
    int4_bf16_enabled,
    int8_bf16_enabled,
    prefill_int8_enabled,
    quantized_linear,
)
from fd_x86.memory import advise_huge_pages
from fd_x86.offline import METHOD_CODE as _OFFLINE_CODE
from fd_x86.offline import W4A8_CODE, w4a8_experts_run
from fd_x86.offline import runs as _offline_runs

__all__ = ["int8_act_rows", "layer_enabled", "layer_in_run", "moe_experts", "moe_layer", "moe_layer_experts", "native_enabled",
           "select_experts"]

_METHOD_CODE = {"wint8": 0, "wint4": 1, "w8a8": 2, **_OFFLINE_CODE, "w4a8": W4A8_CODE}  # the ops' ``method``
WINT4_BF16_CODE = 6  # the ops' code for wint4 on bf16 activations (offline_op.h's kMoeWint4Bf16)
WINT8_BF16_CODE = 7  # the ops' code for wint8 on bf16 activations (offline_op.h's kMoeWint8Bf16)
_NO_BIAS: list[Any] = []  # a 1-element fp32 tensor standing in for a missing correction bias
_LAYER_KEY = "x86.moe_layer"  # in the stacked up_gate weight's backend_cache


def native_enabled() -> bool:
    """Whether the MoE ops run (``FD_X86_MOE_NATIVE`` unset or not ``0``).
    Read on each call, so a benchmark can compare both paths in one process."""
    return os.environ.get("FD_X86_MOE_NATIVE") != "0"


def layer_enabled() -> bool:
    """Whether ``moe_layer`` answers (``FD_X86_MOE_LAYER`` unset or not ``0``,
    and the MoE ops on): ``=0`` leaves the router linear, ``select_experts``
    and ``moe_layer_experts`` as separate calls (A/B comparisons)."""
    return os.environ.get("FD_X86_MOE_LAYER") != "0" and native_enabled()


def moe_experts(x: Any, topk_weights: Any, topk_ids: Any, quant: Any) -> Any:
    """``sum_k w[t, k] * FFN_{ids[t, k]}(x[t])`` for quantized experts, or None."""
    if quant is None:
        return None
    up_q, down_q = quant
    if up_q.method == FP8 and down_q.method == FP8:
        return _fp8_experts(x, topk_weights, topk_ids, up_q, down_q)
    if not _experts_run(up_q, down_q) or down_q.method != up_q.method or len(x.shape) != 2 \
            or len(up_q.qweight.shape) != 3 or len(down_q.qweight.shape) != 3 or not x86_ops._host(x):
        return None
    if up_q.method not in METHODS and not native_enabled():
        return None  # the per-expert path below has the METHODS' kernels only: the reference answers
    if native_enabled():
        return _native_experts(x, topk_weights, topk_ids, up_q, down_q)

    def up_gate(expert: int, rows: Any) -> Any:
        return quantized_linear(rows, expert_weight(up_q, expert), repack=False)

    def down(expert: int, rows: Any) -> Any:
        return quantized_linear(rows, expert_weight(down_q, expert), repack=False)

    def act(h: Any) -> Any:
        out = x86_ops.silu_and_mul(h)
        return out if out is not None else reference_silu_and_mul(h)

    return grouped_experts(x, topk_weights, topk_ids, int(up_q.qweight.shape[0]), up_gate, down, act)


def _fp8_experts(x: Any, topk_weights: Any, topk_ids: Any, up_q: Any, down_q: Any) -> Any:
    """block_wise_fp8 routed experts (the FP8 checkpoints' and ``--quantization
    block_wise_fp8``'s): the host groups the tokens by expert (``grouped_experts``) and
    each expert's two projections run fd_x86's fp8 kernel on its slice of the stacked
    codes; None where that kernel does not run (the reference answers)."""
    if not (native_enabled() and fp8_available()) or len(x.shape) != 2 or len(up_q.qweight.shape) != 3 \
            or len(down_q.qweight.shape) != 3 or not x86_ops._host(x):
        return None

    def up_gate(expert: int, rows: Any) -> Any:
        return expert_block_fp8_linear(rows, up_q, expert)

    def down(expert: int, rows: Any) -> Any:
        return expert_block_fp8_linear(rows, down_q, expert)

    def act(h: Any) -> Any:
        out = x86_ops.silu_and_mul(h)
        return out if out is not None else reference_silu_and_mul(h)

    return grouped_experts(x, topk_weights, topk_ids, int(up_q.qweight.shape[0]), up_gate, down, act)


def moe_layer_experts(x: Any, topk_weights: Any, topk_ids: Any, quant: Any, shared_up_gate: Any,
                      shared_down: Any) -> Any:
    """Routed experts plus the shared expert (``+ down(silu_and_mul(x @
    up_gate))``, added after the routed sum) in one native call, or None:
    when ``moe_experts``' native op would not run, or the shared weights are
    not 2-D ``QuantizedWeight`` of a method the op has (the caller
    then composes ``moe_experts`` and the shared MLP)."""
    if quant is None or not native_enabled() or not _is_2d_quant(shared_up_gate) \
            or not _is_2d_quant(shared_down):
        return None
    up_q, down_q = quant
    if not _experts_run(up_q, down_q) or down_q.method != up_q.method or len(x.shape) != 2 \
            or len(up_q.qweight.shape) != 3 or len(down_q.qweight.shape) != 3 or not x86_ops._host(x) \
            or not _shared_runs(shared_up_gate, shared_down):
        return None
    return _native_experts(x, topk_weights, topk_ids, up_q, down_q, (shared_up_gate, shared_down))


def moe_layer(x: Any, gate: Any, correction_bias: Any, top_k: int, renormalize: bool, norm_min: float, quant: Any,
              shared_up_gate: Any, shared_down: Any) -> Any:
    """Router, routing, routed experts and shared expert (when given) of a
    MoE layer in one native call, or None (off, unquantized or mixed-method
    experts, a float shared expert, non-fp32 / non-CPU inputs, odd shapes):
    ``Ops.moe_layer`` composes the per-op hooks then."""
    if quant is None or not layer_enabled() or len(x.shape) != 2 or not x86_ops._host(x):
        return None
    tensors, attrs = _entry(gate, correction_bias, quant, shared_up_gate, shared_down)
    if tensors is None or not 1 <= top_k <= int(gate.shape[1]):
        return None
    x = x if x.is_contiguous() else x.contiguous()
    return load_ops().fd_x86_moe_layer(x, *tensors, int(top_k), correction_bias is not None, bool(renormalize),
                                       float(norm_min), *attrs, num_threads(), int8_act_rows(int(x.shape[0])))


def int8_act_rows(rows: int) -> int:
    """The MoE ops' ``int8_act_rows`` for a call of ``rows`` tokens: the opt-in
    (``FD_X86_PREFILL_INT8_ACT``) runs calls of at least ``PREFILL_INT8_MIN_ROWS``
    on int8 activations (``PREFILL_INT8_MIN_ROWS``), else 0 (off)."""
    return PREFILL_INT8_MIN_ROWS if rows >= PREFILL_INT8_MIN_ROWS and prefill_int8_enabled() else 0


def layer_in_run(moe: Any) -> tuple[list[Any], list[int], float] | None:
    """A MoE block (``fd_core.ops.decoder.MoELayerWeights``) as the fused
    decoder-layers op runs it (``fd_x86.layer``): its 10 tensors, its 11 ints
    (top_k, has_bias, renormalize, then ``fd_x86_moe_layer``'s method, groups,
    shared expert and isa attributes) and norm_min; None where ``moe_layer``
    would decline it (the same entry, cached on the experts)."""
    quant = moe.quant
    if quant is None or moe.up_gate_weights is not None or moe.down_weights is not None or not layer_enabled():
        return None
    tensors, attrs = _entry(moe.gate, moe.correction_bias, quant, moe.shared_up_gate, moe.shared_down)
    if tensors is None or not 1 <= moe.top_k <= int(moe.gate.shape[1]):
        return None
    ints = [int(moe.top_k), int(moe.correction_bias is not None), int(bool(moe.renormalize)), *map(int, attrs)]
    return tensors, ints, float(moe.norm_min)


def _entry(gate: Any, correction_bias: Any, quant: Any, shared_up_gate: Any, shared_down: Any) -> tuple[Any, Any]:
    """The layer's op tensors (None: the op does not take it) and attributes, cached (``_layer_entry``)."""
    up_q = quant[0]
    cache = getattr(up_q, "backend_cache", None)
    entry = cache.get(_LAYER_KEY) if cache is not None else None
    # every object the entry holds or reads (a QuantizedWeight's tensors may be reassigned in place)
    objs = (gate, correction_bias, quant[1], shared_up_gate, shared_down, up_q.qweight, up_q.scales,
            quant[1].qweight, quant[1].scales, *_tensors(shared_up_gate), *_tensors(shared_down),
            # what the method codes read (bools: compared by identity): the switch, the activation dtypes
            int4_bf16_enabled(), int8_bf16_enabled(), _bf16_act(up_q), _bf16_act(shared_up_gate))
    if entry is None or len(entry[0]) != len(objs) or not all(map(_same, entry[0], objs)):
        entry = _layer_entry(up_q, objs, quant, shared_up_gate, shared_down)
    return entry[1], entry[2]


def _tensors(weight: Any) -> tuple[Any, Any]:
    """A QuantizedWeight's (qweight, scales), or (None, None) for a missing shared expert."""
    return (getattr(weight, "qweight", None), getattr(weight, "scales", None))


def _same(a: Any, b: Any) -> bool:
    return a is b


def _layer_entry(up_q: Any, objs: tuple[Any, ...], quant: Any, shared_up_gate: Any,
                 shared_down: Any) -> tuple[Any, ...]:
    """``(objs, the op's tensors or None, its attributes)`` for a layer, kept
    on ``up_q.backend_cache`` when it takes one (the entry names the objects
    it was built from, so identity stays sound while it is held)."""
    gate, bias = objs[0], objs[1]
    tensors: list[Any] | None = None
    attrs: tuple[int, ...] = ()
    up_q, down_q = quant
    has_shared = shared_up_gate is not None or shared_down is not None
    fits = (_experts_run(up_q, down_q) and down_q.method == up_q.method and len(up_q.qweight.shape) == 3
            and len(down_q.qweight.shape) == 3 and len(gate.shape) == 2 and x86_ops._host(gate)
            and gate.is_contiguous() and int(gate.shape[1]) == int(up_q.qweight.shape[0])
            and int(gate.shape[0]) == int(up_q.in_features))
    if fits and bias is not None:
        fits = x86_ops._host(bias) and bias.is_contiguous() and int(bias.numel()) == int(gate.shape[1])
    if fits and has_shared:
        fits = _is_2d_quant(shared_up_gate) and _is_2d_quant(shared_down) and _shared_runs(shared_up_gate, shared_down)
    if fits:
        if bias is None:
            if not _NO_BIAS:
                _NO_BIAS.append(x86_ops._paddle().zeros([1], dtype="float32"))
            bias = _NO_BIAS[0]
        shared_tensors = ([shared_up_gate.qweight, shared_up_gate.scales, shared_down.qweight, shared_down.scales]
                          if has_shared else [gate] * 4)  # unread without a shared expert
        tensors = [gate, bias, up_q.qweight, up_q.scales, down_q.qweight, down_q.scales, *shared_tensors]
        if os.environ.get("FD_X86_EXPERT_HUGEPAGES") != "0":  # =0: 4 KiB pages (A/B comparisons)
            for weight in (up_q.qweight, down_q.qweight):  # the experts stream from memory: 2 MiB pages
                advise_huge_pages(weight)
        attrs = (_code(up_q), _group(up_q), _group(down_q), has_shared,
                 _code(shared_up_gate) if has_shared else 0,
                 _group(shared_up_gate) if has_shared else -1, _group(shared_down) if has_shared else -1, 0)
    entry = (objs, tensors, attrs)
    cache = getattr(up_q, "backend_cache", None)
    if cache is None:
        try:
            up_q.backend_cache = cache = {}
        except (AttributeError, TypeError):  # frozen / slotted: checked on every call instead
            return entry
    cache[_LAYER_KEY] = entry
    return entry


def _experts_run(up_q: Any, down_q: Any) -> bool:
    """The routed experts' method has a native kernel here: the contract
    layouts' (``METHODS``) or, on AVX-512 VNNI CPUs, w4a8's and the offline
    formats' (``fd_x86.offline``) where the widths fit them (wint2: inputs a
    multiple of 128, w4a8_static: even, w4a8: ``w4a8_experts_run``)."""
    method = up_q.method
    if method in METHODS:
        return True
    if method == "w4a8":
        return w4a8_experts_run(up_q, down_q)
    multiple = 128 if method == "wint2" else 2
    return _offline_runs(method) and up_q.in_features % multiple == 0 and down_q.in_features % multiple == 0


def _shared_runs(up: Any, down: Any) -> bool:
    """The shared expert's two 2-D weights share a method the ops run for it:
    wint8 / wint4 / w8a8, or w4a8 where ``w4a8_experts_run`` takes them."""
    if down.method != up.method:
        return False
    return up.method in METHODS or (up.method == "w4a8" and w4a8_experts_run(up, down))


def _is_2d_quant(weight: Any) -> bool:
    return isinstance(weight, QuantizedWeight) and len(weight.qweight.shape) == 2


def _native_experts(x: Any, topk_weights: Any, topk_ids: Any, up_q: Any, down_q: Any,
                    shared: tuple[Any, Any] | None = None) -> Any:
    paddle = x86_ops._paddle()
    if topk_ids.dtype != paddle.int64:
        topk_ids = topk_ids.astype("int64")
    if topk_weights.dtype != paddle.float32:
        topk_weights = topk_weights.astype("float32")
    x, topk_ids, topk_weights = (t if t.is_contiguous() else t.contiguous() for t in (x, topk_ids, topk_weights))
    ops = load_ops()
    if shared is None:
        return ops.fd_x86_moe_experts(
            x, topk_ids, topk_weights, up_q.qweight, up_q.scales, down_q.qweight, down_q.scales,
            _code(up_q), _group(up_q), _group(down_q), 0, num_threads(),
        )
    s_up, s_down = shared
    return ops.fd_x86_moe_experts_shared(
        x, topk_ids, topk_weights, up_q.qweight, up_q.scales, down_q.qweight, down_q.scales,
        s_up.qweight, s_up.scales, s_down.qweight, s_down.scales,
        _code(up_q), _group(up_q), _group(down_q), _code(s_up), _group(s_up),
        _group(s_down), 0, num_threads(),
    )


def _bf16_act(quant: Any) -> bool:
    return getattr(quant, "act_dtype", "float32") == "bfloat16"


def _code(quant: Any) -> int:
    """The ops' ``method`` code for ``quant``: wint4 whose model's activations are bf16
    (``QuantizedWeight.act_dtype``) takes ``WINT4_BF16_CODE`` where that kernel may run
    (``fd_x86.linear.int4_bf16_enabled``; the op falls back to wint4's kernels for widths it
    cannot take), as ``fd_x86.linear`` does for the dense linears; wint8 likewise
    ``WINT8_BF16_CODE`` (``int8_bf16_enabled``; the op's kernel needs K % 32 == 0, else
    wint8's fp32 kernel runs)."""
    if quant.method == "wint4" and _bf16_act(quant) and int4_bf16_enabled():
        return WINT4_BF16_CODE
    if quant.method == "wint8" and _bf16_act(quant) and int8_bf16_enabled():
        return WINT8_BF16_CODE
    return _METHOD_CODE[quant.method]


def _group(quant: Any) -> int:
    return quant.group_size if quant.group_size and quant.group_size > 0 else -1


def select_experts(router_logits: Any, top_k: int, correction_bias: Any, renormalize: bool,
                   norm_min: float) -> tuple[Any, Any] | None:
    """``(topk_weights [T, k] fp32, topk_ids [T, k] int64)`` as the reference
    routes, or None (off, non-fp32 / non-CPU logits or bias, odd shapes)."""
    if not native_enabled() or len(router_logits.shape) != 2 or not x86_ops._host(router_logits):
        return None
    if not 1 <= top_k <= router_logits.shape[1]:
        return None  # the reference raises its own error
    if correction_bias is not None:
        if not x86_ops._host(correction_bias) or int(correction_bias.numel()) != router_logits.shape[1]:
            return None
        bias = correction_bias if correction_bias.is_contiguous() else correction_bias.contiguous()
    else:
        if not _NO_BIAS:
            _NO_BIAS.append(x86_ops._paddle().zeros([1], dtype="float32"))
        bias = _NO_BIAS[0]
    logits = router_logits if router_logits.is_contiguous() else router_logits.contiguous()
    weights, ids = load_ops().fd_x86_moe_select(logits, bias, int(top_k), correction_bias is not None,
                                                bool(renormalize), float(norm_min))
    return weights, ids
