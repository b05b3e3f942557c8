"""Quantized linear layers through the C++ ops.

``quantized_linear(x, quant)`` runs ``x [..., in] @ W`` for a
``fd_core.ops.linear.QuantizedWeight`` of a method in ``METHODS``, reading
the paddle tensors' own memory (no copies of the weights; ``x`` is copied
only when it is not contiguous fp32). Layouts (the fd-core contract):

- wint8 / w8a8: ``qweight`` int8 ``[out, in]``, ``scales`` fp32 ``[out]``
- wint4: ``qweight`` uint8 ``[out, in // 2]`` (low nibble = even input),
  ``scales`` fp32 ``[out, in // group_size]`` (``[out, 1]`` per channel)

On AVX-512 VNNI CPUs the first call repacks the weight once into blocks of
16 output channels (``pack_weight``; see ``csrc/kernels.h``) and caches it on
the ``QuantizedWeight`` (``quant.backend_cache["x86"]``, keyed by the
content keys of ``qweight`` / ``scales``, ``fd_core.ops.content_key``:
replacing them or writing into them through paddle repacks). That costs one more copy of the weight
(about its size), in transparent huge pages (``fd_x86.memory``);
``FD_X86_REPACK=0`` turns it off (the contract-layout
kernels then run, several times slower at batch > 1).

``FD_X86_PREFILL_INT8_ACT=1`` (opt-in; it changes numerics) runs wint8 and
wint4 calls of at least ``PREFILL_INT8_MIN_ROWS`` rows (prefill chunks) with
their activations quantized per token to int8 as w8a8 does (``s_t = max|x_t|
/ 127``, ``rint``, clip to +-127) on the VNNI kernels: wint8 on w8a8's
kernel over the same contract weight (the two methods share the weight
format; no copy), wint4 on its packed word layout with exact int32 dot
products per group and the groups summed in fp32
(``csrc/kernels_prefill_avx512.cc``). Decode-sized calls keep fp32
activations, so a token's result then depends on the size of the step it
ran in: chunked prefill or preemption may change outputs, which the default
path guarantees they do not. Read on each call (A/B comparisons in one
process).

wint4 on bf16 activations: where a wint4 weight's model has bf16 activations
(``QuantizedWeight.act_dtype``, set by the loader from ``--dtype bfloat16``,
FastDeploy's numerics and ``x86``'s default for bf16 checkpoints; x86's own
ops keep activations in fp32 between calls), on a CPU with avx512_bf16 and
the packed word layout, the call runs
``csrc/kernels_int4_bf16.cc``: the codes (exact in bf16) times the
activations as bf16 on ``vdpbf16ps``, each group's products summed in fp32.
The activations are the reference's operands already, so only the fp32
summation order differs from it; the kernel does about half the fp32
kernel's instructions per weight (1.4-1.9x at 1-512 rows on Zen 4). It runs at
every row count, so the kernel and the rounding do not depend on the step's
size (the fp32 summation order does, with the row tile, as the fp32 kernels'
has: README "Seeds and batch invariance").
``FD_X86_INT4_BF16=0`` keeps the fp32 kernel (A/B comparisons; read on each
call).

wint8 on bf16 activations likewise (``wint8_bf16``): a wint8 weight whose model's
activations are bf16, with an even K, on a CPU with avx512_bf16, is repacked into
the pairs layout (``pack_weight("wint8_pairs", ...)``: each channel's codes of an
input pair side by side, so a 32-byte load becomes 16 channels' bf16 pairs,
exactly) and runs ``csrc/kernels_int8_bf16.cc`` at every row count (it replaces
both wint8 kernels above and their 7-row switch): one fp32 chain per output, the
inputs in order, so a token's bits do not depend on its step's size; from 16
rows a work item converts its codes to bf16 once and every row tile reads them.
``FD_X86_INT8_BF16=0`` keeps the fp32 kernels (read on each call).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from fd_core.backends.cpu import num_threads
from fd_core.ops.content_key import tensor_key
from fd_x86.build import load_ops
from fd_x86.memory import host_tensor
from fd_x86.packing import pack_weight, wint4_words

__all__ = ["ISAS", "METHODS", "PREFILL_INT8_MIN_ROWS", "bf16_activations", "int4_bf16_enabled", "int8_bf16_enabled",
           "pack_weight", "prefill_int8_enabled", "quantized_linear", "wint4_packed_method", "wint4_words", "wint8_bf16"]

METHODS = ("wint8", "wint4", "w8a8")
ISAS = {"auto": 0, "avx2": 1, "avx512": 2}  # the op's ``isa`` attribute
_PACKED_METHOD = {"wint8": 0, "wint4": 1, "w8a8": 2}  # fd_x86_packed_linear's ``method``
# wint8 with more rows than this runs the contract-layout kernel even where
# the weight is packed: its 4 x 4 dot-product tiles beat the packed 8 x 32
# broadcast tiles once the fp32 FMAs, not memory, bound the call (measured on
# Zen 4: packed 1.4x faster at 1 row, ~5% at 4-6, ~10% slower at 8 and 32)
WINT8_PACKED_MAX_ROWS = 7
# FD_X86_PREFILL_INT8_ACT: calls with at least this many rows take int8 activations
PREFILL_INT8_MIN_ROWS = 32
_INT8_ACT_METHOD = {"wint8": 7, "wint4": 6}  # fd_x86_packed_linear's codes (csrc/packed_linear.h)
WINT4_BF16_METHOD = 9  # its code for packed wint4 words on bf16 activations (kWint4Bf16Act)
WINT8_BF16_METHOD = 10  # its code for wint8 pairs on bf16 activations (kWint8Bf16Act)


def prefill_int8_enabled() -> bool:
    """``FD_X86_PREFILL_INT8_ACT=1``: the opt-in int8-activation prefill
    path (module doc). Read on each call."""
    return os.environ.get("FD_X86_PREFILL_INT8_ACT") == "1"


def int4_bf16_enabled() -> bool:
    """The bf16-activation wint4 kernel may run (module doc): the CPU has avx512_bf16
    and ``FD_X86_INT4_BF16`` is not "0" (read on each call)."""
    return os.environ.get("FD_X86_INT4_BF16") != "0" and _has_bf16_dot()


def int8_bf16_enabled() -> bool:
    """The bf16-activation wint8 kernels may run (module doc): the CPU has avx512_bf16
    and ``FD_X86_INT8_BF16`` is not "0" (read on each call)."""
    return os.environ.get("FD_X86_INT8_BF16") != "0" and _has_bf16_dot()


@functools.lru_cache(maxsize=1)
def _has_bf16_dot() -> bool:
    from fd_x86.cpu import AVX512_BF16_FLAG, cpu_features

    return cpu_features().has(AVX512_BF16_FLAG)


def bf16_activations(quant: Any) -> bool:
    """Whether ``quant``'s model's activations are bf16 (``QuantizedWeight.act_dtype``; x86's
    own ops keep them fp32 between calls). Told by the weight alone, as the fused run and the
    MoE ops tell it, so a row takes the same kernel on every path."""
    return getattr(quant, "act_dtype", "float32") == "bfloat16"


def wint4_packed_method(in_features: int, group_size: int, bf16_activations: bool) -> int:
    """``fd_x86_packed_linear``'s code for a packed wint4 weight: the bf16-activation
    kernel where the activations are bf16 and it runs here (module doc), else 1."""
    if bf16_activations and wint4_words(in_features, group_size) and int4_bf16_enabled():
        return WINT4_BF16_METHOD
    return _PACKED_METHOD["wint4"]


def wint8_bf16(quant: Any) -> bool:
    """Whether a 2-D wint8 ``quant`` runs the bf16-activation kernel here (module doc):
    its model's activations are bf16, K is even, the packed kernels and that kernel
    run on this CPU. The fused run asks the same."""
    return quant.method == "wint8" and bf16_activations(quant) and int(quant.in_features) % 2 == 0 \
        and len(quant.qweight.shape) == 2 and _use_packed("auto") and int8_bf16_enabled()


@functools.lru_cache(maxsize=1)
def _has_vnni() -> bool:
    from fd_x86.cpu import AVX512_VNNI_FLAGS, cpu_features

    return cpu_features().has(*AVX512_VNNI_FLAGS)


def _use_packed(isa: str) -> bool:
    return isa != "avx2" and os.environ.get("FD_X86_REPACK") != "0" and _has_vnni()


def _packed(quant: Any, layout: str | None = None) -> tuple[Any, Any] | None:
    """(packed weight, its scales) as paddle tensors, cached on ``quant``;
    None where this weight is not packed (not 2-D, or ``quant`` takes no
    attributes): the contract-layout kernels answer then. ``layout``: a
    ``pack_weight`` layout other than the method's own (``"wint8_pairs"``),
    cached beside it (A/B switches flip between the two)."""

    if len(quant.qweight.shape) != 2:
        return None
    cache = getattr(quant, "backend_cache", None)
    if cache is None:
        cache = {}
        try:
            quant.backend_cache = cache
        except (AttributeError, TypeError):  # frozen / slotted: repacking per call would cost more
            return None
    key = (tensor_key(quant.qweight), tensor_key(quant.scales))
    slot = "x86" if layout is None else f"x86:{layout}"
    entry = cache.get(slot)
    if entry is not None and entry[0] == key:
        return entry[2], entry[3]
    group = quant.group_size if quant.group_size and quant.group_size > 0 else -1
    if layout is None:
        layout = "wint4" if quant.method == "w4a8" else quant.method  # w4a8 stores wint4's layout
    w, s = pack_weight(layout, quant.qweight.numpy(), quant.scales.numpy(), group)
    packed_w, packed_s = host_tensor(w), host_tensor(np.ascontiguousarray(s, dtype=np.float32))
    # the entry holds the tensors its key names: were they freed, a new tensor could
    # take their memory (and so their key) while the entry still answered for it
    cache[slot] = (key, (quant.qweight, quant.scales), packed_w, packed_s)
    return packed_w, packed_s


def quantized_linear(x: Any, quant: Any, isa: str = "auto", threads: int | None = None, repack: bool = True) -> Any:
    """``x [..., in] -> [..., out]`` (x's dtype) with the native kernel for
    ``quant.method``; ``isa`` forces a kernel family (tests), ``threads``
    defaults to fd-core's CPU thread count (FD_CPU_NUM_THREADS or the cores).
    ``repack=False`` runs the contract-layout kernel: for weights made per
    call (an expert's slice of a stacked weight), whose repacked copy would
    not be reused."""
    if quant.method == "block_wise_fp8":  # its own op and layout (fd_x86.fp8)
        from fd_x86.fp8 import block_fp8_linear

        return block_fp8_linear(x, quant, threads)
    if quant.method not in METHODS:
        raise ValueError(f"fd_x86 has no kernel for quantization method {quant.method!r}; has {METHODS}")
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {sorted(ISAS)}, got {isa!r}")
    ops = load_ops()
    d_out = quant.out_features
    x2 = as_rows(x, quant.in_features, quant.method)
    nthreads = threads or num_threads()
    group = quant.group_size if quant.group_size and quant.group_size > 0 else -1
    if x2.shape[0] >= PREFILL_INT8_MIN_ROWS and quant.method in _INT8_ACT_METHOD and isa == "auto" \
            and prefill_int8_enabled() and _has_vnni():
        out = _int8_act_linear(ops, x2, quant, group, nthreads, repack)
        if out is not None:
            return from_rows(out, x, d_out)
    if repack and isa == "auto" and wint8_bf16(quant):
        pairs = _packed(quant, "wint8_pairs")
        if pairs is not None:
            out = ops.fd_x86_packed_linear(x2, pairs[0], pairs[1], WINT8_BF16_METHOD, d_out, -1, nthreads)
            return from_rows(out, x, d_out)
    use_packed = repack and _use_packed(isa) and (quant.method != "wint8" or x2.shape[0] <= WINT8_PACKED_MAX_ROWS)
    packed = _packed(quant) if use_packed else None
    if packed is not None:
        method = _PACKED_METHOD[quant.method]
        if quant.method == "wint4" and isa == "auto":
            method = wint4_packed_method(quant.in_features, group, bf16_activations(quant))
        out = ops.fd_x86_packed_linear(x2, packed[0], packed[1], method, d_out, group, nthreads)
    else:
        if quant.method == "wint8":
            out = ops.fd_x86_wint8_linear(x2, quant.qweight, quant.scales, ISAS[isa], nthreads)
        elif quant.method == "w8a8":
            out = ops.fd_x86_w8a8_linear(x2, quant.qweight, quant.scales, ISAS[isa], nthreads)
        else:
            out = ops.fd_x86_wint4_linear(x2, quant.qweight, quant.scales, ISAS[isa], nthreads, group)
        if out.shape[-1] != d_out:
            raise ValueError(
                f"{quant.method} linear: qweight has {out.shape[-1]} output channels, expected {d_out}")
    return from_rows(out, x, d_out)


def _int8_act_linear(ops: Any, x2: Any, quant: Any, group: int, nthreads: int, repack: bool) -> Any:
    """The opt-in int8-activation kernel for ``x2 [M, in]`` (module doc), or
    None where it has no kernel for this weight (the fp32 path runs)."""
    if quant.method == "wint8":
        if len(quant.qweight.shape) != 2 or not quant.qweight.is_contiguous() or not quant.scales.is_contiguous():
            return None
        return ops.fd_x86_packed_linear(x2, quant.qweight, quant.scales, _INT8_ACT_METHOD["wint8"],
                                        quant.out_features, -1, nthreads)
    if not repack or not _use_packed("auto") or not wint4_words(quant.in_features, group):
        return None
    packed = _packed(quant)
    if packed is None:
        return None
    return ops.fd_x86_packed_linear(x2, packed[0], packed[1], _INT8_ACT_METHOD["wint4"], quant.out_features, group,
                                    nthreads)


def w4a8_linear(x: Any, quant: Any, threads: int | None = None) -> Any:
    """``w4a8`` (int4 weights in wint4's layout, per-token dynamic int8 activations:
    ``fd_core.quantization.w4a8``) for a 2-D weight on the packed int4 words with
    int8 activations (``csrc/kernels_prefill_avx512.cc``: the activations quantized as
    w8a8's, each group's int8 x int4 dot product exact in int32 by ``vpdpbusd``, then the
    group scale and the token's scale in fp32): the reference's numbers up to fp32
    summation order, at every row count. None where that kernel does not run (no VNNI,
    ``FD_X86_REPACK=0``, K or the group not a multiple of 8, a stacked weight): the
    reference answers."""
    group = quant.group_size if quant.group_size and quant.group_size > 0 else -1
    if quant.method != "w4a8" or len(quant.qweight.shape) != 2 or not _use_packed("auto") \
            or not wint4_words(quant.in_features, group):
        return None
    x2 = as_rows(x, quant.in_features, quant.method)
    packed = _packed(quant)
    if packed is None:
        return None
    out = load_ops().fd_x86_packed_linear(x2, packed[0], packed[1], _INT8_ACT_METHOD["wint4"], quant.out_features,
                                          group, threads or num_threads())
    return from_rows(out, x, quant.out_features)


def as_rows(x: Any, d_in: int, method: str) -> Any:
    """``x [..., in]`` as the contiguous fp32 ``[M, in]`` the native linears take (no copy
    when it already is: a decode step makes ~70 of these calls, paddle's Python-side ops
    cost ~3 us each); raises naming ``method`` when the widths differ."""
    import paddle

    if x.shape[-1] != d_in:
        raise ValueError(f"{method} linear: x has {x.shape[-1]} input features, the weight {d_in}")
    x2 = x if len(x.shape) == 2 else x.reshape([-1, d_in])
    if x2.dtype != paddle.float32:
        x2 = x2.astype("float32")
    return x2 if x2.is_contiguous() else x2.contiguous()


def from_rows(out: Any, x: Any, d_out: int) -> Any:
    """A native linear's ``[M, out]`` fp32 result back in ``x``'s leading shape and dtype."""
    if len(x.shape) != 2:
        out = out.reshape(list(x.shape[:-1]) + [d_out])
    return out if out.dtype == x.dtype else out.astype(x.dtype)
