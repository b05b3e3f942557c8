"""Quantized linear layers through the C++ ops.

``quantized_linear(x, quant)`` runs ``x [..., in] @ W`` for a
``fd_core.ops.linear.QuantizedWeight`` of a method in ``METHODS``, reading
the paddle tensors' own memory (no copies of the weights; ``x`` is copied
only when it is not contiguous fp32). Layouts (the fd-core contract):

- wint8 / w8a8: ``qweight`` int8 ``[out, in]``, ``scales`` fp32 ``[out]``
- wint4: ``qweight`` uint8 ``[out, in // 2]`` (low nibble = even input),
  ``scales`` fp32 ``[out, in // group_size]`` (``[out, 1]`` per channel)
"""

from __future__ import annotations

from typing import Any

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops

__all__ = ["ISAS", "METHODS", "quantized_linear"]

METHODS = ("wint8", "wint4", "w8a8")
ISAS = {"auto": 0, "avx2": 1, "avx512": 2}  # the op's ``isa`` attribute


def quantized_linear(x: Any, quant: Any, isa: str = "auto", threads: int | None = None) -> Any:
    """``x [..., in] -> [..., out]`` (x's dtype) with the native kernel for
    ``quant.method``; ``isa`` forces a kernel family (tests), ``threads``
    defaults to fd-core's CPU thread count (FD_CPU_NUM_THREADS or the cores)."""
    import paddle

    if quant.method not in METHODS:
        raise ValueError(f"fd_x86 has no kernel for quantization method {quant.method!r}; has {METHODS}")
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {sorted(ISAS)}, got {isa!r}")
    ops = load_ops()
    d_in, d_out = quant.in_features, quant.out_features
    if x.shape[-1] != d_in:
        raise ValueError(f"{quant.method} linear: x has {x.shape[-1]} input features, the weight {d_in}")
    lead = list(x.shape[:-1])
    x2 = x.reshape([-1, d_in])
    if x2.dtype != paddle.float32:
        x2 = x2.astype("float32")
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    nthreads = threads or num_threads()
    qweight, scales = quant.qweight, quant.scales
    if quant.method == "wint8":
        out = ops.fd_x86_wint8_linear(x2, qweight, scales, ISAS[isa], nthreads)
    elif quant.method == "w8a8":
        out = ops.fd_x86_w8a8_linear(x2, qweight, scales, ISAS[isa], nthreads)
    else:
        group = quant.group_size if quant.group_size and quant.group_size > 0 else -1
        out = ops.fd_x86_wint4_linear(x2, qweight, scales, ISAS[isa], nthreads, group)
    if out.shape[-1] != d_out:
        raise ValueError(f"{quant.method} linear: qweight has {out.shape[-1]} output channels, expected {d_out}")
    out = out.reshape(lead + [d_out])
    return out if out.dtype == x.dtype else out.astype(x.dtype)
