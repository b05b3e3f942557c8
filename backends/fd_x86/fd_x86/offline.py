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
"""

from __future__ import annotations

import functools
from typing import Any

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops

__all__ = ["METHOD_CODE", "OFFLINE_METHODS", "available", "offline_linear", "runs"]

OFFLINE_METHODS = ("w4a8_static", "wint2")
METHOD_CODE = {"w4a8_static": 3, "wint2": 4}  # the ops' ``method`` (csrc/offline_op.h)


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this CPU runs the kernels (AVX-512 F/BW/VL/DQ and VNNI)."""
    from fd_x86.cpu import AVX512_VNNI_FLAGS, cpu_features

    return cpu_features().has(*AVX512_VNNI_FLAGS)


def runs(method: str) -> bool:
    """Whether ``method`` is an offline format this CPU has kernels for."""
    return method in METHOD_CODE and available()


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
