"""The offline-checkpoint expert formats on the native kernels: ``w4a8_static``
(FastDeploy's W4A8C8 experts) and ``wint2`` (its 2Bits experts).

Both come only from offline-quantized checkpoints (``fd_core.quantization.offline``)
and only for routed experts, which ``fd_x86.moe`` runs through the MoE ops
(``csrc/x86_moe_op.cc``, method codes ``METHOD_CODE``); ``offline_linear``
runs one 2-D matrix (``fd_x86_offline_linear``, the backend's ``fd_linear``)
with the same kernels (``csrc/kernels_offline_avx512.cc``), weights read in place:

- ``w4a8_static``: int4 codes per channel (``qweight`` uint8 ``[out, in/2]``)
  against int8 activations quantized with the matrix's static activation
  max exactly as the reference (``clip(rint(x * (127 / a)), +-127)``), exact
  int32 dot products on VNNI, then ``* s_w * (a / 127)``: equal to
  ``fd_core.quantization.w4a8.w4a8_static_linear`` up to fp32 rounding.
- ``wint2``: the five FastDeploy tensors (``fd_core.quantization.wint2``)
  decoded in registers, each code as the reference computes it (the same
  fp32 steps), ``x * q`` summed in fp32 per 64-input group, times the group
  scale: equal to ``wint2_linear`` up to fp32 rounding order (one weight
  alone comes out bit for bit). No dequantized copy of the weights is made.

Needs AVX-512 VNNI; ``available()`` says whether this CPU has it (elsewhere
the reference answers).

The same VNNI arithmetic serves fd-core's dynamic ``w4a8`` experts
(``csrc/kernels_w4a8_avx512.cc``, MoE method code ``W4A8_CODE``): wint4's
contract int4 layout read in place, activations quantized per token exactly as
``fd_core.quantization.w8a8.quantize_activations``, each group's int8 x int4 dot
product exact in int32, then the group scale and the token's scale in fp32: the
reference's numbers up to fp32 summation order, each token computed alone (the
same bits whatever the batch). ``w4a8_experts_run`` says which weights it takes.
"""

from __future__ import annotations

import functools
from typing import Any

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops

__all__ = ["METHOD_CODE", "OFFLINE_METHODS", "W4A8_CODE", "available", "offline_linear", "runs", "w4a8_experts_run"]

OFFLINE_METHODS = ("w4a8_static", "wint2")
METHOD_CODE = {"w4a8_static": 3, "wint2": 4}  # the ops' ``method`` (csrc/offline_op.h)
W4A8_CODE = 5  # the MoE ops' ``method`` for w4a8 experts (kMoeW4a8)


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this CPU runs the kernels (AVX-512 F/BW/VL/DQ and VNNI)."""
    from fd_x86.cpu import AVX512_VNNI_FLAGS, cpu_features

    return cpu_features().has(*AVX512_VNNI_FLAGS)


def runs(method: str) -> bool:
    """Whether ``method`` is an offline format this CPU has kernels for."""
    return method in METHOD_CODE and available()


def w4a8_experts_run(*quants: Any) -> bool:
    """Whether the MoE ops run these ``w4a8`` weights natively (routed experts, or a
    layer's shared expert): AVX-512 VNNI, and every weight's input width and group
    size (per channel: the width) multiples of 128, the group dividing the width
    (the kernel's int8 planes are whole 64-byte blocks per group). Elsewhere the MoE
    ops are not called and the reference answers (e.g. groups of 64)."""
    if not available():
        return False
    for quant in quants:
        d_in = int(quant.in_features)
        group = quant.group_size if quant.group_size and quant.group_size > 0 else d_in
        if quant.method != "w4a8" or d_in % 128 or group % 128 or d_in % group:
            return False
    return True


def offline_linear(x: Any, quant: Any, threads: int | None = None) -> Any:
    """``x [..., in] @ W`` in fp32 (in ``x``'s dtype) for a 2-D ``w4a8_static`` / ``wint2`` ``quant``."""
    from fd_x86.linear import as_rows, from_rows

    if quant.method not in METHOD_CODE or len(quant.qweight.shape) != 2:
        raise ValueError(f"offline_linear takes a 2-D weight of {', '.join(OFFLINE_METHODS)}, got {quant.method} "
                         f"{list(quant.qweight.shape)}")
    x2 = as_rows(x, quant.in_features, quant.method)
    qweight, scales = (t if t.is_contiguous() else t.contiguous() for t in (quant.qweight, quant.scales))
    out = load_ops().fd_x86_offline_linear(x2, qweight, scales, METHOD_CODE[quant.method], threads or num_threads())
    return from_rows(out, x, quant.out_features)
