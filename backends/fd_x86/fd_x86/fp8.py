"""Block-wise fp8 (``block_wise_fp8``) linear layers through the C++ op.

``block_fp8_linear(x, quant)`` runs ``x [..., in] @ W`` for a
``fd_core.ops.linear.QuantizedWeight`` of method ``block_wise_fp8``
(``fd_core.quantization.block_fp8``: uint8 e4m3 codes ``[out, in]``, fp32
block scales ``[ceil(out/128), ceil(in/128)]``), reading the weight in place.
The op quantizes the activations per token and group of 128 exactly as the
reference does (the same fp32 division and e4m3 rounding: bit-identical
codes and scales), then decodes the e4m3 weights in registers (through fp16,
``csrc/kernels_fp8_avx512.cc``) and sums each 128-input group in fp32 before
scaling it: equal to the reference up to fp32 summation order. Needs AVX-512
(F/BW/VL/DQ); ``available()`` says whether this CPU has it (the backend's
``fd_linear`` lets the reference answer where not). Routed experts and the
fused decoder layers keep the reference for this method.
"""

from __future__ import annotations

import functools
from typing import Any

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops

__all__ = ["METHOD", "available", "block_fp8_linear"]

METHOD = "block_wise_fp8"


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this CPU runs the op (AVX-512 F/BW/VL/DQ)."""
    from fd_x86.cpu import AVX512_FLAGS, cpu_features

    return cpu_features().has(*AVX512_FLAGS)


def block_fp8_linear(x: Any, quant: Any, threads: int | None = None) -> Any:
    """``x [..., in] @ W`` in fp32 (in ``x``'s dtype) for a 2-D block-wise fp8 ``quant``."""
    import paddle

    if quant.method != METHOD or len(quant.qweight.shape) != 2:
        raise ValueError(f"block_fp8_linear takes a 2-D {METHOD} weight, got {quant.method} "
                         f"{list(quant.qweight.shape)}")
    d_in, d_out = quant.in_features, quant.out_features
    shape = x.shape
    if shape[-1] != d_in:
        raise ValueError(f"{METHOD} linear: x has {shape[-1]} input features, the weight {d_in}")
    x2 = x if len(shape) == 2 else x.reshape([-1, d_in])
    if x2.dtype != paddle.float32:
        x2 = x2.astype("float32")
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    qweight, scales = quant.qweight, quant.scales
    if not qweight.is_contiguous():
        qweight = qweight.contiguous()
    if not scales.is_contiguous():
        scales = scales.contiguous()
    out = load_ops().fd_x86_block_fp8_linear(x2, qweight, scales, threads or num_threads())
    if len(shape) != 2:
        out = out.reshape(list(shape[:-1]) + [d_out])
    return out if out.dtype == x.dtype else out.astype(x.dtype)
