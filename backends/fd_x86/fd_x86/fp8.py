"""Block-wise fp8 (``block_wise_fp8``) linear layers through the C++ op.

``block_fp8_linear(x, quant)`` runs ``x [..., in] @ W`` for a
``fd_core.ops.linear.QuantizedWeight`` of method ``block_wise_fp8``
(``fd_core.quantization.block_fp8``: uint8 e4m3 codes ``[out, in]``, fp32
block scales ``[ceil(out/128), ceil(in/128)]``), reading the weight in place.
The op quantizes the activations per token and group of 128 exactly as the
reference does (the same fp32 division and e4m3 rounding: bit-identical
codes and scales), then sums each 128-input group's products in fp32 before
scaling it: equal to the reference up to fp32 summation order. Two kernels
(``selected_kernel()`` says which runs here):

- ``bf16`` (AVX-512 BF16 + VBMI: Zen 4, Sapphire Rapids and later;
  ``csrc/kernels_fp8_bf16.cc``): e4m3 weights and activations are exact in
  bf16, so ``vdpbf16ps`` sums their products exactly, 32 per instruction;
  the weights are decoded by two table lookups (``vpermi2b``) per 64 codes;
- ``fma`` (any AVX-512 F/BW/VL/DQ; ``csrc/kernels_fp8_avx512.cc``): the
  weights decoded through fp16 (``vcvtph2ps``), fp32 FMAs.

The codes are read in their contract layout, from a copy in transparent
huge pages made on first use (``resident_codes``: a decode step streams
every weight from DRAM, and 4 KiB pages cost the TLB ~20% of the bandwidth,
``fd_x86.memory``), cached on the weight as wint8's repacked copy is, and
like it one more copy of the codes' size (``FD_X86_REPACK=0`` or
``FD_X86_HUGEPAGES=0``: none, the weight itself is read).

Needs AVX-512 (F/BW/VL/DQ); ``available()`` says whether this CPU has it
(the backend's ``fd_linear`` lets the reference answer where not). The
fused decoder layers (``fd_x86.layer``) run the same kernels, and routed
experts too, one expert at a time on its slice of the stacked codes
(``expert_block_fp8_linear``, called by ``fd_x86.moe``).
"""

from __future__ import annotations

import functools
from typing import Any

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops

__all__ = ["KERNELS", "METHOD", "available", "block_fp8_linear", "resident_codes", "selected_kernel"]

METHOD = "block_wise_fp8"
KERNELS = {"auto": 0, "fma": 1, "bf16": 2}  # the op's kernel attr
BF16_FLAGS = ("avx512_bf16", "avx512vbmi")  # /proc/cpuinfo names of what the bf16 kernel needs
_CACHE_KEY = "x86.fp8"  # in quant.backend_cache: (content key, its tensors, the codes in huge pages)


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this CPU runs the op (AVX-512 F/BW/VL/DQ)."""
    from fd_x86.cpu import AVX512_FLAGS, cpu_features

    return cpu_features().has(*AVX512_FLAGS)


@functools.lru_cache(maxsize=1)
def selected_kernel() -> str | None:
    """The kernel ``"auto"`` runs here: ``"bf16"``, ``"fma"``, or None (no AVX-512)."""
    from fd_x86.cpu import cpu_features

    if not available():
        return None
    return "bf16" if cpu_features().has(*BF16_FLAGS) else "fma"


def resident_codes(quant: Any) -> Any:
    """``quant.qweight`` as the kernels read it: a copy in huge pages, made
    once and cached on ``quant`` (keyed by the codes' content key, so
    replacing or writing into them copies again); ``quant.qweight`` itself
    where the copies are off (``FD_X86_REPACK=0``, ``FD_X86_HUGEPAGES=0``, no
    AVX-512 VNNI) or ``quant`` takes no attributes. Called by
    ``block_fp8_linear`` and ``fd_x86.layer``."""
    import numpy as np

    from fd_core.ops.content_key import tensor_key
    from fd_x86 import memory
    from fd_x86.linear import _use_packed

    qweight = quant.qweight
    if not memory.enabled() or not _use_packed("auto") or len(qweight.shape) != 2:
        return qweight
    cache = getattr(quant, "backend_cache", None)
    if cache is None:
        cache = {}
        try:
            quant.backend_cache = cache
        except (AttributeError, TypeError):  # frozen / slotted: a copy per call would cost more
            return qweight
    key = tensor_key(qweight)
    entry = cache.get(_CACHE_KEY)
    if entry is not None and entry[0] == key:
        return entry[2]
    codes = memory.host_tensor(np.ascontiguousarray(qweight.numpy()))
    cache[_CACHE_KEY] = (key, qweight, codes)  # holds what its key names (fd_x86.linear._packed says why)
    return codes


def block_fp8_linear(x: Any, quant: Any, threads: int | None = None, kernel: str = "auto") -> Any:
    """``x [..., in] @ W`` in fp32 (in ``x``'s dtype) for a 2-D block-wise fp8
    ``quant``. ``kernel`` forces one of ``KERNELS`` (tests, benchmarks); the op
    refuses ``"bf16"`` on a CPU without it."""
    from fd_x86.linear import as_rows, from_rows

    if kernel not in KERNELS:
        raise ValueError(f"block_fp8_linear: kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    if quant.method != METHOD or len(quant.qweight.shape) != 2:
        raise ValueError(f"block_fp8_linear takes a 2-D {METHOD} weight, got {quant.method} "
                         f"{list(quant.qweight.shape)}")
    x2 = as_rows(x, quant.in_features, METHOD)
    qweight, scales = resident_codes(quant), quant.scales
    if not qweight.is_contiguous():
        qweight = qweight.contiguous()
    if not scales.is_contiguous():
        scales = scales.contiguous()
    out = load_ops().fd_x86_block_fp8_linear(x2, qweight, scales, threads or num_threads(), KERNELS[kernel])
    return from_rows(out, x, quant.out_features)


def expert_block_fp8_linear(x: Any, stacked: Any, expert: int, threads: int | None = None) -> Any:
    """``x [T, in] @ W_expert`` in fp32 for routed experts stacked as ``[E, out, in]`` codes
    with ``[E, ceil(out/128), ceil(in/128)]`` scales (``fd_core.quantization.block_fp8``):
    the expert's slices are read in place (no resident copy per call: an expert's
    slice is a new weight object every call, so ``resident_codes``' cache would miss)."""
    import paddle

    x2 = x if x.dtype == paddle.float32 else x.astype("float32")
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    codes, scales = stacked.qweight[expert], stacked.scales[expert]
    if not codes.is_contiguous():
        codes = codes.contiguous()
    if not scales.is_contiguous():
        scales = scales.contiguous()
    return load_ops().fd_x86_block_fp8_linear(x2, codes, scales, threads or num_threads(), KERNELS["auto"])
