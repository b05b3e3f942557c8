"""The fused dense decoder layers (``fd_decoder_layers``) for decode steps.

At a few requests a decode step of the 0.3B model is ~18 layers x 9 op calls;
each call costs 10-20 us of Python, pluggy and paddle dispatch, and the
calls between the quantized matmuls added ~30% to the matmuls' own time at
batch 1. ``fd_x86_decoder_layers`` (``csrc/x86_ops.cc``) runs a whole run of
layers (all 18 of the 0.3B model) in one call with the same kernels as the
separate ops: the norms, the packed quantized linears, the fused QKV /
rotary / cache store and the paged decode attention.

It answers decode-only steps whose layers' four linear weights are each
quantized with wint8, wint4, w8a8, w4a8 (VNNI: the int4 words with per-token int8
activations, as ``fd_x86.linear.w4a8_linear``) or block_wise_fp8 (AVX-512: ``fd_x86.fp8``'s
kernels, the weight read in place), or unquantized bf16 / fp16 (``--dtype
bfloat16|float16|float32``: ``fd_x86.dense16``'s kernels, in place), on fp32 CPU activations (norm weights
may be bf16/fp16 under ``--dtype``: upcast once, cached with the run), over
KV caches of any ``--kv-cache-dtype`` the native KV ops read (fp32; bf16,
fp16, int8 and fp8 on AVX-512: ``fd_x86.ops._kv_parts``), with the kernel
``fd_x86.linear`` would pick (the packed one; for wint8 above
``WINT8_PACKED_MAX_ROWS`` rows the contract layout's; for wint4 / wint8 in a
bf16 model the bf16-activation kernels at every row count), when the layers share
their shape (heads, eps, scale, rotary layout) and have no q/k norms or
biases (the op has none; Qwen3's layers compose); anything else returns
None and the separate ops run layer by layer (``fd_core.ops.decoder``).
What a run needs (packed weights, widened norms, the op's argument lists) is
cached by the run's content key (``fd_core.ops.content_key``), not by the
layer objects, which the models build afresh each step.
``FD_X86_FUSED_LAYER=0`` turns it off (A/B comparisons).

A run's last layer may be attention only (``up_gate`` / ``down`` None: a
MoE layer's attention half, which ERNIE's MoE layers run before their
``fd_x86_moe_layer``): the op takes that layer's qkv and o alone and stops
after its post-attention norm (``last_attention_only``), returning the
MLP's input and the residual stream. ``FD_X86_FUSED_MOE_ATTENTION=0``
declines such runs alone (A/B comparisons: the attention half then runs
op by op, as before).

A layer may carry its MoE block (``DecoderLayerWeights.moe``; the plugin
declares ``FD_DECODER_LAYERS_MOE``): the op runs it after the layer's
post-attention norm with ``fd_x86_moe_layer``'s code and tensors
(``fd_x86.moe.layer_in_run``), so ERNIE's whole MoE stack is one call a
decode step instead of two per MoE layer. A block ``fd_x86_moe_layer``
would decline (unquantized or mixed-method experts, a float shared expert)
declines the whole run, which ``Ops`` then splits at the MoE layers.
``FD_X86_FUSED_MOE_RUN=0`` declines every run with a MoE block (A/B
comparisons: the split runs, each MoE block its own call).

A run may end with the model's head (``head``: a ``DecoderHead``; the
plugin declares ``FD_DECODER_LAYERS_HEAD``): the op then normalizes the
last layer's stream with the final norm and runs the LM head (any weight a
layer's linear may be: quantized, or the bf16 / fp16 / fp32 tied head in place)
with the kernel ``fd_linear`` picks for as many rows, and returns the
logits: a decode step's forward after the embedding is one call, and the
~40 us the final norm and ~25 us the LM head's call cost after the run
streamed the weights through the caches are gone. A head it cannot take
(a float64 head, a norm not on the host) declines the whole run; ``Ops``
then runs the layers and the head's own ops. ``FD_X86_FUSED_HEAD=0``
declines every run with a head (A/B comparisons).

Such a run may start at the token embedding (``hidden``: a
``DecoderEmbedding``; the plugin declares ``FD_DECODER_LAYERS_EMBEDDING``):
the op reads the ids' rows of the fp32 / bf16 / fp16 table itself and
refuses an id outside it before any cache write; a table it cannot read in
place (a tied float head's transposed view) is gathered here first.
``FD_X86_FUSED_EMBEDDING=0`` gathers every table first (A/B comparisons).

A cached run's inputs are held natively (a plan), a step's positions,
slots, lengths and block tables arrive as one tensor, and the embedding's
checks live in ``fd_x86.run_step``.

``decoder_steps`` (``fd_decoder_steps``: multi-step decoding,
``--num-scheduler-steps``) runs such a whole-model run, from the embedding to
the head, several decode steps in one call (``fd_x86_run_plan_steps``): each
step's tokens (greedy, or sampled rows drawn by the code ``fd_x86_sample``
runs, ``fd_x86.sampling``) are taken natively and fed to the next, so the engine's
Python (scheduler, inputs, sampler, outputs: ~0.25 ms a step after the
kernels) is paid once for the steps. It answers only the runs
``decoder_layers`` would take with the embedding and the head in the plan.
"""

from __future__ import annotations

import functools
import operator
import os
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from fd_core.backends.cpu import num_threads
from fd_core.ops.content_key import tensor_key
from fd_core.ops.linear import QuantizedWeight
from fd_x86 import ops as x86_ops
from fd_x86.build import load_ops
from fd_x86.dense16 import dense16_enabled
from fd_x86.fp8 import available as fp8_available
from fd_x86.fp8 import resident_codes as fp8_resident_codes
from fd_x86.linear import (
    _INT8_ACT_METHOD,
    _PACKED_METHOD,
    METHODS,
    PREFILL_INT8_MIN_ROWS,
    WINT8_BF16_METHOD,
    WINT8_PACKED_MAX_ROWS,
    _has_vnni,
    _packed,
    _use_packed,
    int4_bf16_enabled,
    int8_bf16_enabled,
    prefill_int8_enabled,
    wint4_packed_method,
    wint4_words,
    wint8_bf16,
)
from fd_x86.moe import int8_act_rows, layer_enabled, layer_in_run
from fd_x86.run_step import (
    ORPHANS,
    Plan,
    RunInputs,
    embedding_enabled,
    embedding_fits,
    free_orphans,
    plans_enabled,
    step_ints,
)
from fd_x86.sampling import enabled as sampling_enabled
from fd_x86.sampling import op_args as sampling_op_args

__all__ = ["decoder_steps", "decoder_layers"]

WINT8_CONTRACT = 3  # the op's kernel code for wint8 on the contract layout [out, in]
BLOCK_FP8 = 8  # its code for block_wise_fp8 codes [out, in] (packed_linear.h's kBlockFp8Method)
# its codes for unquantized weights [in, out] read in place (packed_linear.h): 16-bit, and fp32
DENSE16 = {"paddle.bfloat16": 4, "paddle.float16": 5, "paddle.float32": 11}
# Per model (keyed by its rotary table, which it owns for its lifetime, through a weak
# reference: the model's cache goes with it): the runs seen lately, content key -> (what the
# entry holds, the op's inputs for the run or None when it does not fit), and each run's last
# answer by signature (see _run_inputs). A model has a few runs (one per span of dense
# layers) and two kernel choices per run; an entry holds its tensors, so their memory (and so
# their keys) cannot be reused while it is cached. Nothing in a model's cache refers to its
# rotary table, so the cache does not keep the model alive.
MAX_RUNS = 32


class _ModelRuns:
    def __init__(self) -> None:
        self.runs: OrderedDict[Hashable, tuple[Any, Any]] = OrderedDict()
        self.recent: dict[tuple[int, int], tuple[list[Any], list[Any], Any]] = {}


_MODELS: dict[int, tuple[Any, _ModelRuns]] = {}


def _model_runs(cos_sin: Any) -> _ModelRuns:
    key = id(cos_sin)
    entry = _MODELS.get(key)
    if entry is not None and entry[0]() is cos_sin:
        return entry[1]
    runs = _ModelRuns()
    _MODELS[key] = (weakref.ref(cos_sin, lambda _ref: _MODELS.pop(key, None)), runs)
    return runs


@functools.lru_cache(maxsize=1)
def _enabled() -> bool:
    return os.environ.get("FD_X86_FUSED_LAYER", "1") != "0"


@functools.lru_cache(maxsize=1)
def _attention_only_enabled() -> bool:
    return os.environ.get("FD_X86_FUSED_MOE_ATTENTION", "1") != "0"


def _head_enabled() -> bool:
    """``FD_X86_FUSED_HEAD=0``: the head after the run, as its own ops (A/B comparisons; read per call)."""
    return os.environ.get("FD_X86_FUSED_HEAD", "1") != "0"


def _moe_run_enabled() -> bool:
    """Read on each call, so a benchmark can compare both paths in one process."""
    return os.environ.get("FD_X86_FUSED_MOE_RUN", "1") != "0"


def _fits(layer: Any, cos_sin: Any, pools: tuple[Any, ...] | None) -> bool:
    """Whether the op takes this layer: no q/k norms or biases (the op has
    none), norms, rotary table and caches it reads (``pools``: the caches as
    ``fd_x86.ops._kv_parts`` gives them, any KV dtype; Dh % 8 == 0), and the
    packed kernels run here."""
    return bool(layer.plain and pools is not None and _use_packed("auto") and x86_ops._host(cos_sin)
                and all(n.place.is_cpu_place() and n.dtype in _norm_dtypes() for n in (layer.input_norm, layer.post_norm))
                and layer.head_dim % 8 == 0 and cos_sin.shape[-1] == layer.head_dim)


@functools.lru_cache(maxsize=1)
def _norm_dtypes() -> tuple[Any, ...]:
    paddle = x86_ops._paddle()
    return (paddle.float32, paddle.bfloat16, paddle.float16)


def _fp32(norm: Any) -> Any:
    """A norm weight as the op takes it (fp32, contiguous). With ``--dtype
    bfloat16|float16`` it is upcast here, once per cached run: ``[D]`` per
    norm, so the fused path keeps running with 16-bit weights elsewhere."""
    if norm.dtype != x86_ops._paddle().float32:
        norm = norm.astype("float32")
    return x86_ops._dense(norm)


# a call's rows as the linears' kernel choice sees them
PACKED_ROWS, CONTRACT_ROWS, INT8_ACT_ROWS = 0, 1, 2


def _rows_mode(rows: int) -> int:
    """``INT8_ACT_ROWS`` where ``fd_linear`` would run wint8 / wint4 on int8
    activations (the opt-in ``FD_X86_PREFILL_INT8_ACT`` at ``PREFILL_INT8_MIN_ROWS``
    rows and more), ``CONTRACT_ROWS`` above ``WINT8_PACKED_MAX_ROWS`` (wint8's
    contract-layout kernel), else ``PACKED_ROWS``."""
    if rows >= PREFILL_INT8_MIN_ROWS and prefill_int8_enabled() and _has_vnni():
        return INT8_ACT_ROWS
    return CONTRACT_ROWS if rows > WINT8_PACKED_MAX_ROWS else PACKED_ROWS


def _packed_linear(quant: Any, mode: int) -> tuple[list[Any], int, int, int] | None:
    """One linear as the op takes it: its (weight, scales) tensors, kernel
    code, output width and wint4 group; None when it has no kernel here.
    The kernel is the one ``fd_linear`` runs for the same rows (``mode``:
    ``_rows_mode``) and activations (wint4 and wint8 in a bf16 model take them as
    bf16: ``fd_x86.linear.wint4_packed_method`` / ``wint8_bf16``), so a row's result does not depend
    on whether the linear ran in a run."""
    if not isinstance(quant, QuantizedWeight):
        # an unquantized weight (16-bit or fp32), read in place by fd_x86.dense16's kernels at every row count
        code = DENSE16.get(str(getattr(quant, "dtype", "")))
        if code is None or not dense16_enabled() or len(quant.shape) != 2 or not quant.is_contiguous() \
                or not quant.place.is_cpu_place():
            return None
        return [quant, _no_scales()], code, int(quant.shape[1]), -1
    if quant.method == "block_wise_fp8" and len(quant.qweight.shape) == 2 and fp8_available():
        # read in place by fd_x86.fp8's kernels (csrc/fp8_kernels.h)
        if not quant.qweight.is_contiguous() or not quant.scales.is_contiguous():
            return None
        return [fp8_resident_codes(quant), quant.scales], BLOCK_FP8, int(quant.out_features), -1
    group = int(quant.group_size) if quant.group_size and quant.group_size > 0 else -1
    if mode == INT8_ACT_ROWS and quant.method in _INT8_ACT_METHOD:
        # the opt-in int8 activations, as fd_x86.linear._int8_act_linear (else its fp32 path below)
        if quant.method == "wint8":
            if len(quant.qweight.shape) != 2 or not quant.qweight.is_contiguous() \
                    or not quant.scales.is_contiguous():
                return None
            return [quant.qweight, quant.scales], _INT8_ACT_METHOD["wint8"], int(quant.out_features), -1
        if wint4_words(int(quant.in_features), group):
            packed = _packed(quant)
            if packed is None:
                return None
            return list(packed), _INT8_ACT_METHOD["wint4"], int(quant.out_features), group
    if quant.method == "w4a8":
        # int4 words with per-token int8 activations on VNNI (fd_x86.linear.w4a8_linear's kernel)
        packed = _packed(quant) if _use_packed("auto") and wint4_words(int(quant.in_features), group) else None
        if packed is None:
            return None
        return list(packed), _INT8_ACT_METHOD["wint4"], int(quant.out_features), group
    if quant.method not in METHODS:
        return None
    if wint8_bf16(quant):
        # the pairs layout on bf16 activations at every row count, as fd_x86.linear runs it
        pairs = _packed(quant, "wint8_pairs")
        if pairs is None:
            return None
        return list(pairs), WINT8_BF16_METHOD, int(quant.out_features), -1
    if quant.method == "wint8" and mode != PACKED_ROWS:
        # the contract layout's kernel, as fd_x86.linear picks at this many rows
        if len(quant.qweight.shape) != 2 or not quant.qweight.is_contiguous() or not quant.scales.is_contiguous():
            return None
        return [quant.qweight, quant.scales], WINT8_CONTRACT, int(quant.out_features), group
    packed = _packed(quant)
    if packed is None:
        return None
    method = _PACKED_METHOD[quant.method]
    if quant.method == "wint4":
        method = wint4_packed_method(int(quant.in_features), group, quant.act_dtype == "bfloat16")
    return list(packed), method, int(quant.out_features), group


def _packed_linears(layer: Any, mode: int) -> tuple[list[Any], list[int], list[int], list[int]] | None:
    """The four linears' (two in an attention-only or MoE layer) (weight,
    scales) tensors, kernel codes, output widths and wint4 groups; None when
    one has no kernel here."""
    weights, methods, widths, groups = [], [], [], []
    linears = (layer.qkv, layer.o) if layer.up_gate is None else (layer.qkv, layer.o, layer.up_gate, layer.down)
    for quant in linears:
        one = _packed_linear(quant, mode)
        if one is None:
            return None
        weights += one[0]
        methods.append(one[1])
        widths.append(one[2])
        groups.append(one[3])
    return weights, methods, widths, groups


def _switches() -> tuple[bool, bool, bool, bool]:
    """The environment switches a run's build reads (FD_X86_REPACK, FD_X86_DENSE16, FD_X86_INT4_BF16,
    FD_X86_INT8_BF16)."""
    return _use_packed("auto"), dense16_enabled(), int4_bf16_enabled(), int8_bf16_enabled()


@functools.lru_cache(maxsize=1)
def _no_scales() -> Any:
    """The scales slot of a 16-bit weight (the op reads none): one fp32 value."""
    return x86_ops._paddle().zeros([1], dtype="float32")


def _head_args(head: Any | None, ints: list[int]) -> tuple[int, int, int, float]:
    """The op's head attributes: kernel code (-1: no head), width, group and the final norm's eps."""
    if head is None:
        return -1, 0, -1, 0.0
    return ints[0], ints[1], ints[2], float(head.eps)


def _same_shape(layers: list[Any]) -> bool:
    first = layers[0]
    return all(
        (layer.eps, layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.scale, layer.interleaved_rope)
        == (first.eps, first.num_heads, first.num_kv_heads, first.head_dim, first.scale, first.interleaved_rope)
        for layer in layers[1:]
    )


# norms, k / v caches and scales, weights, methods, widths, groups, then the layer kinds and the MoE
# blocks' tensors, ints and norm_min (the op's)
# blocks' tensors, ints and norm_min (the op's), then the head's tensors (final norm, weight, scales) and
# ints (kernel code, width, group), empty without a head
Run = tuple[list[Any], list[Any], list[Any], list[Any], list[Any], list[Any], list[int], list[int], list[int],
            list[int], list[Any], list[int], list[float], list[Any], list[int]]
DENSE_LAYER, ATTENTION_ONLY_LAYER, MOE_LAYER = 0, 1, 2  # the op's layer kinds


def _build_head(head: Any, width: int, mode: int) -> tuple[list[Any], list[int]] | None:
    """The head's tensors (fp32 final norm, weight, scales) and ints (kernel code, width, group) as the op
    takes them, or None where it does not fit (its norm, or an LM head with no kernel in a run here)."""
    norm = head.norm
    if not (norm.place.is_cpu_place() and norm.dtype in _norm_dtypes() and int(norm.numel()) == width):
        return None
    linear = _packed_linear(head.weight, mode)
    if linear is None:
        return None
    return [_fp32(norm), *linear[0]], [linear[1], linear[2], linear[3]]


def _build_run(layers: list[Any], cos_sin: Any, k_caches: list[Any], v_caches: list[Any], mode: int,
               head: Any | None = None) -> RunInputs | None:
    if not (len(layers) == len(k_caches) == len(v_caches)) or not _same_shape(layers) \
            or any(layer.attention_only for layer in layers[:-1]):
        return None
    norms: list[Any] = []
    k_data: list[Any] = []
    v_data: list[Any] = []
    k_scales: list[Any] = []
    v_scales: list[Any] = []
    weights: list[Any] = []
    methods: list[int] = []
    widths: list[int] = []
    groups: list[int] = []
    kinds: list[int] = []
    moe_tensors: list[Any] = []
    moe_ints: list[int] = []
    moe_norm_min: list[float] = []
    for layer, k_cache, v_cache in zip(layers, k_caches, v_caches):
        pools = x86_ops._kv_parts(k_cache, v_cache)
        linears = _packed_linears(layer, mode) if _fits(layer, cos_sin, pools) else None
        if linears is None or pools is None:
            return None
        if layer.moe is not None:
            block = layer_in_run(layer.moe)
            if block is None:
                return None
            moe_tensors += block[0]
            moe_ints += block[1]
            moe_norm_min.append(block[2])
            kinds.append(MOE_LAYER)
        else:
            kinds.append(ATTENTION_ONLY_LAYER if layer.attention_only else DENSE_LAYER)
        norms += [_fp32(layer.input_norm), _fp32(layer.post_norm)]
        k_data.append(pools[0])
        v_data.append(pools[1])
        # a float pool's scales entry is unused by the op: any fp32 tensor
        k_scales.append(_no_scales() if pools[2] is None else pools[2])
        v_scales.append(_no_scales() if pools[3] is None else pools[3])
        weights += linears[0]
        methods += linears[1]
        widths += linears[2]
        groups += linears[3]
    head_tensors: list[Any] = []
    head_ints: list[int] = []
    if head is not None:
        built = _build_head(head, int(layers[0].input_norm.shape[0]), mode)
        if built is None:
            return None
        head_tensors, head_ints = built
    return RunInputs((norms, k_data, v_data, k_scales, v_scales, weights, methods, widths, groups, kinds,
                       moe_tensors, moe_ints, moe_norm_min, head_tensors, head_ints))


def _signature(layers: list[Any], k_caches: list[Any], v_caches: list[Any], mode: int,
               head: Any | None = None) -> tuple[list[Any], list[Any]]:
    """What pins a cached run, cheaply: the objects it was built from (compared
    by identity) and their shapes' scalars, the weights' in-place versions and
    the switches the build read (compared by value). Caches are written in
    place by design: identity only. The rotary table is the per-model cache's
    key (``_model_runs``), so it is not held here."""
    objs: list[Any] = [*k_caches, *v_caches]
    vals: list[Any] = [mode, *_switches()]
    for cache in (*k_caches, *v_caches):
        codes = getattr(cache, "codes", None)  # an 8-bit pool: its codes and scales may be replaced
        if codes is not None:
            objs += (codes, cache.scales)
    for layer in layers:
        vals += (layer.eps, layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.scale,
                 layer.interleaved_rope)
        for t in (layer.input_norm, layer.post_norm, layer.q_norm, layer.k_norm, layer.qkv_bias, layer.o_bias):
            objs.append(t)
            vals.append(None if t is None else t._inplace_version())
        for w in (layer.qkv, layer.o, layer.up_gate, layer.down):
            q = getattr(w, "qweight", None)
            if w is None:  # an attention-only or MoE layer's MLP
                vals.append(None)
            elif q is None:
                objs.append(w)
                vals.append(w._inplace_version())
            else:
                objs += (w, q, w.scales)
                vals += (w.method, w.group_size, w.act_dtype, q._inplace_version(), w.scales._inplace_version())
        moe = layer.moe
        if moe is None:
            vals.append(None)
            continue
        # the op reads the block's tensors in place (nothing derived from their values): identity
        vals += (moe.top_k, moe.renormalize, moe.norm_min)
        objs += (moe.gate, moe.correction_bias, moe.up_gate_weights, moe.down_weights, moe.shared_up_gate,
                 moe.shared_down)
        for w in (*(moe.quant or ()), moe.shared_up_gate, moe.shared_down):
            q = getattr(w, "qweight", None)
            if q is not None:
                objs += (q, w.scales)
                vals += (w.method, w.group_size, w.act_dtype)
    if head is not None:  # last: the run's slot in _run_inputs is keyed by the last object
        w, q = head.weight, getattr(head.weight, "qweight", None)
        objs += (head.norm, w) if q is None else (head.norm, q, w.scales, w)
        vals += (head.eps, head.norm._inplace_version(),
                 *((w._inplace_version(),) if q is None
                   else (w.method, w.group_size, w.act_dtype, q._inplace_version(), w.scales._inplace_version())))
    return objs, vals


def _run_inputs(layers: list[Any], cos_sin: Any, k_caches: list[Any], v_caches: list[Any], rows: int,
                head: Any | None = None) -> RunInputs | None:
    """The op's per-layer inputs for the run (norms, caches, weights and the
    kernels' codes, widths and groups), or None when a layer does not fit.

    Cached by content (``fd_core.ops.content_key``): the layers' keys, the
    caches' and the rotary table's memory, and the kernel choice, so a
    weight replaced or written in place through paddle is seen. In front of
    that, each run's last answer is checked by ``_signature`` (the same
    objects, scalars and versions: ~60 us for the 0.3B's 18 layers against
    ~280 us for the content key, whose nested tuple is costly to build and
    hash). Identity is sound there because the entry holds the objects: a
    live object's identity cannot pass to a new one."""
    mode = _rows_mode(rows)
    cache = _model_runs(cos_sin)
    objs, vals = _signature(layers, k_caches, v_caches, mode, head)
    # the run's last weight (a MoE block's may be None): runs of one model differ there
    slot = (id(next(o for o in reversed(objs) if o is not None)), mode)
    recent = cache.recent.get(slot)
    if recent is not None and recent[1] == vals and len(recent[0]) == len(objs) \
            and all(map(operator.is_, recent[0], objs)):
        return recent[2]  # type: ignore[no-any-return]
    key = (mode, *_switches(), tensor_key(cos_sin, version=False),
           *(tensor_key(c, version=False) for c in k_caches),
           *(tensor_key(c, version=False) for c in v_caches), *(layer.key() for layer in layers),
           None if head is None else head.key())
    entry = cache.runs.get(key)
    if entry is not None:
        cache.runs.move_to_end(key)
        answer = entry[1]
    else:
        answer = _build_run(layers, cos_sin, k_caches, v_caches, mode, head)
        # the entry holds every tensor its key names (through the layers and the head), so their
        # memory, and with it the key, cannot be reused while it is cached
        cache.runs[key] = ((layers, k_caches, v_caches, head), answer)
        while len(cache.runs) > MAX_RUNS:
            cache.runs.popitem(last=False)
    if len(cache.recent) >= MAX_RUNS:
        cache.recent.clear()
    cache.recent[slot] = (objs, vals, answer)
    return answer


def decoder_steps(layers: list[Any], embedding: Any, cos_sin: Any, metadata: Any, k_caches: list[Any],
                  v_caches: list[Any], head: Any, steps: int, vocab_size: int, sampling: Any = None) -> Any:
    """Tokens ``[steps, T]`` int64 (``fd_decoder_steps``), or None where ``decoder_layers`` would not
    take the run from the embedding to the head in one plan (see the module doc), or where ``sampling``
    asks for a draw this backend's ``fd_sample`` leaves to the reference (``fd_x86.sampling.enabled``)."""
    rows = int(embedding.ids.shape[0]) if hasattr(embedding, "ids") else 0
    if head is None or rows == 0 or not layers or metadata.num_decodes != rows or not _enabled() \
            or not plans_enabled() or not embedding_enabled() or len(embedding.ids.shape) != 1 \
            or str(embedding.ids.dtype) != "paddle.int64" or layers[-1].attention_only or not _head_enabled() \
            or (sampling is not None and not sampling_enabled(sampling.method)):
        return None
    table, transposed = embedding.table, False
    if not embedding_fits(embedding):  # a tied float head's [V, D] view of its weight: the op gathers its columns
        if not _tied_view(table, head.weight):
            return None
        table, transposed = head.weight, True
    if not _moe_switches_on(layers) or (
            not isinstance(head.weight, QuantizedWeight) and str(head.weight.dtype) not in DENSE16):
        return None
    inputs = _run_inputs(layers, cos_sin, k_caches, v_caches, rows, head)
    if inputs is None:
        return None
    int8_rows = int8_act_rows(rows) if inputs[11] else 0  # moe_ints: the MoE blocks' opt-in, as decoder_layers
    draw = _sampling_inputs(sampling, rows, int(steps))
    return load_ops().fd_x86_run_plan_steps(
        x86_ops._dense(cos_sin), step_ints(metadata), embedding.ids, table, *draw,
        _plan(inputs, layers[0], head).id, int(metadata.block_size), num_threads(), int8_rows, int(steps),
        int(vocab_size), transposed, sampling is not None)


def _sampling_inputs(sampling: Any, rows: int, steps: int) -> list[Any]:
    """The op's temperature [T] fp32, top_k [T] int64, top_p [T] fp32, min_p [T] fp32 and uniforms
    [steps, T, R] fp32 (empty tensors for greedy steps)."""
    if sampling is None:
        return _no_sampling()
    args = (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.uniforms)
    if [int(x.shape[0]) for x in args[:4]] != [rows] * 4 or list(sampling.uniforms.shape[:2]) != [steps, rows]:
        raise ValueError(f"decoder_steps: sampling arguments for {rows} rows and {steps} steps expected, got "
                         f"{[list(x.shape) for x in args]}")
    return sampling_op_args(args, ("float32", "int64", "float32", "float32", "float32"))


@functools.lru_cache(maxsize=1)
def _no_sampling() -> list[Any]:
    """The sampling inputs of a greedy run: empty placeholders, made once (the op does not read them)."""
    import paddle

    empty = paddle.zeros([0], dtype="float32")
    return [empty, paddle.zeros([0], dtype="int64"), empty, empty, empty]


def _moe_switches_on(layers: list[Any]) -> bool:
    """A run with MoE blocks only with the MoE switches on, read on each call (a cached run does not see them)."""
    return not any(layer.moe is not None for layer in layers) or (_moe_run_enabled() and layer_enabled())


def _plan(inputs: RunInputs, first: Any, head: Any | None) -> Plan:
    """The run's native plan, made on its first use (orphaned plans freed first)."""
    if ORPHANS:
        free_orphans()
    if inputs.plan is None:
        inputs.plan = Plan(inputs, first, _head_args(head, inputs[14]))  # inputs[14]: the head's ints
    return inputs.plan


def _tied_view(table: Any, weight: Any) -> bool:
    """``table`` is the transposed view of the float head ``weight`` [D, V] (``fd_core.layers.basic.tie_lm_head``),
    a contiguous host fp32 / bf16 / fp16 tensor."""
    return (not isinstance(weight, QuantizedWeight) and str(weight.dtype) in DENSE16 and weight.is_contiguous()
            and weight.place.is_cpu_place() and len(weight.shape) == 2 and len(table.shape) == 2
            and list(table.shape) == [weight.shape[1], weight.shape[0]] and table.data_ptr() == weight.data_ptr()
            and list(table.strides) == [1, int(weight.shape[1])] and table.dtype == weight.dtype)


def decoder_layers(layers: list[Any], hidden: Any, residual: Any | None, cos_sin: Any, metadata: Any,
                   k_caches: list[Any], v_caches: list[Any], head: Any | None = None) -> Any:
    """``(hidden, residual)`` after the run of layers, the logits with ``head``, or None (see the module doc).
    ``hidden`` may be a ``DecoderEmbedding`` (a run with ``head``): the op takes its rows itself."""
    embedding = None
    if not hasattr(hidden, "shape"):  # a DecoderEmbedding
        if embedding_fits(hidden) and embedding_enabled():
            embedding = hidden
            hidden = embedding.ids
        else:
            hidden = hidden.run()
    rows = hidden.shape[0]
    if rows == 0 or not layers or metadata.num_decodes != rows or not _enabled() \
            or len(hidden.shape) != (1 if embedding is not None else 2):
        return None
    attention_only = layers[-1].attention_only
    if attention_only and not _attention_only_enabled():
        return None
    if not _moe_switches_on(layers):
        return None
    if (embedding is None and not x86_ops._host(hidden)) or (residual is not None and not x86_ops._host(residual)):
        return None
    if head is not None and (attention_only or not _head_enabled() or (
            not isinstance(head.weight, QuantizedWeight) and str(head.weight.dtype) not in DENSE16)):
        return None  # a head no kernel in a run takes (float64), told by its dtype: before the run's signature
    inputs = _run_inputs(layers, cos_sin, k_caches, v_caches, rows, head)
    if inputs is None:
        return None
    (norms, k_list, v_list, k_scales, v_scales, weights, methods, widths, groups, kinds, moe_tensors, moe_ints,
     moe_norm_min, head_tensors, head_ints) = inputs
    dense = x86_ops._dense
    cos_sin = dense(cos_sin)
    # with the embedding, the op's hidden slot is unused (any fp32 tensor: the rotary table)
    hidden = cos_sin if embedding is not None else dense(hidden)
    first = layers[0]
    int8_rows = int8_act_rows(rows) if moe_ints else 0  # the MoE blocks' opt-in, as fd_x86_moe_layer's
    ints = step_ints(metadata)
    ids, table = (embedding.ids, embedding.table) if embedding is not None else (ints, cos_sin)  # unused without
    if plans_enabled():
        out, total = load_ops().fd_x86_run_plan_step(
            hidden, hidden if residual is None else dense(residual), cos_sin, ints, ids, table,
            _plan(inputs, first, head).id,
            residual is not None, int(metadata.block_size), num_threads(), int8_rows, embedding is not None)
        return out if head is not None else (out, total)
    out, total = load_ops().fd_x86_decoder_layers(
        hidden, hidden if residual is None else dense(residual), cos_sin, ints, ids, table,
        norms, k_list, v_list, k_scales, v_scales, weights, moe_tensors or [hidden],
        head_tensors[0] if head_tensors else hidden, head_tensors[1:] or [hidden, hidden], residual is not None, kinds,
        methods, widths, groups, float(first.eps),
        int(first.num_heads), int(first.num_kv_heads), bool(first.interleaved_rope), int(metadata.block_size),
        float(first.scale), num_threads(), moe_ints, moe_norm_min, int8_rows,
        *_head_args(head, head_ints), embedding is not None,
    )
    return out if head is not None else (out, total)
