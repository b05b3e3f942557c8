"""Unquantized linears on 16-bit weights (``--dtype bfloat16|float16``).

``dense16_linear(x, weight, bias)`` computes fd-core's ``reference_linear``
(``x [..., K] @ W [K, N] + bias``, fp32 out) on a bfloat16 / float16 weight
in the reference's own layout, read in place, in 16 bits, once per call: no
fp32 copy of the weight and no repacked one is kept (``csrc/kernels_dense16.cc``):

- stream (decode, M < ``GEMM_MIN_ROWS``; every fp16 call): the weight is
  widened to fp32 in registers and multiplied with fp32 FMAs, so each product
  is the reference's exactly and the result differs from it only by the fp32
  summation order (about 1e-6 of ``|x| @ |W|``);
- bf16 GEMM (bf16 weights, M >= ``GEMM_MIN_ROWS``, CPUs with avx512_bf16):
  ``vdpbf16ps`` on x rounded to bf16 (round to nearest even) and W packed per
  thread into scratch panels. A product of two bf16s is exact in fp32, so the
  only extra error is x's rounding: ``|out - ref| <= 2**-9 * (|x| @ |W|)``
  plus fp32 summation (``GEMM_REL_ERR``).

An fp32 weight (``--dtype float32``) takes the stream kernel up to
``FP32_STREAM_MAX_ROWS`` rows, read in place without widening: fp32 products and
sums, as the reference's matmul, so the result differs from it only by the
summation order. At decode sizes it reads the weight at the memory's rate, where
paddle's matmul does not (an fp32 0.3B step with the fused run: 1.42x at B=1, 1.68x
at B=8, 1.64x at B=32; README "Native 16-bit kernels on x86"); for prefill-sized
calls paddle's matmul stayed faster in the model (0.87x with the stream kernel at
512 rows), so those return None.

It returns None, and fd-core's reference answers, where it does not apply:
a weight that is not a contiguous 2-D bf16 / fp16 / fp32 CPU tensor, x not
fp32, a CPU without AVX-512 F/BW/VL/DQ, or ``FD_X86_DENSE16=0`` in the
environment.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops
from fd_x86.cpu import AVX512_BF16_FLAG, AVX512_FLAGS, DENSE16_GEMM_MIN_ROWS, cpu_features

__all__ = ["FP32_STREAM_MAX_ROWS", "GEMM_MIN_ROWS", "GEMM_REL_ERR", "KERNELS", "dense16_enabled", "dense16_linear"]

KERNELS = {"auto": 0, "stream": 1, "gemm": 2}  # the op's ``kernel`` attribute
# bf16 calls with this many rows run the GEMM (as kernels.h's kDense16GemmMinRows).
# Measured on Zen 4, 1 thread, W [1024, 3072] read from DRAM: stream / GEMM
# 0.39 / 0.58 ms at 8 rows, 0.62 / 0.64 at 12, 0.78 / 0.67 at 16, 1.55 / 0.91
# at 32 (the GEMM's packing reads W at ~12 GB/s; from cache the GEMM wins from 3 rows)
GEMM_MIN_ROWS = DENSE16_GEMM_MIN_ROWS
GEMM_REL_ERR = 2.0**-9  # the GEMM's bound, relative to |x| @ |W| (x rounded to bf16)
FP32_STREAM_MAX_ROWS = 64  # fp32 weights: the stream kernel up to this many rows, paddle's matmul above
_DTYPES = ("paddle.bfloat16", "paddle.float16", "paddle.float32")


@functools.lru_cache(maxsize=1)
def _cpu_ok() -> bool:
    return cpu_features().has(*AVX512_FLAGS)


@functools.lru_cache(maxsize=1)
def _has_bf16_dot() -> bool:
    return cpu_features().has(AVX512_BF16_FLAG)


def dense16_enabled() -> bool:
    """The CPU has AVX-512 F/BW/VL/DQ and ``FD_X86_DENSE16`` is not "0"."""
    return os.environ.get("FD_X86_DENSE16") != "0" and _cpu_ok()


def dense16_linear(x: Any, weight: Any, bias: Any | None = None, kernel: str = "auto",
                   threads: int | None = None) -> Any | None:
    """``x [..., K] @ weight [K, N] (+ bias)`` as fp32 ``[..., N]``, or None
    where the native kernels do not apply (see the module doc). ``kernel``
    forces "stream" or "gemm" (tests); ``threads`` defaults to fd-core's CPU
    thread count. Raises ValueError when x's last dimension is not K."""
    if str(weight.dtype) not in _DTYPES or str(x.dtype) != "paddle.float32" or len(weight.shape) != 2:
        return None
    if not weight.place.is_cpu_place() or not x.place.is_cpu_place() or not weight.is_contiguous():
        return None
    if not dense16_enabled():
        return None
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    d_in, d_out = weight.shape
    shape = x.shape
    if str(weight.dtype) == "paddle.float32" and kernel == "auto" and int(np.prod(shape[:-1])) > FP32_STREAM_MAX_ROWS:
        return None  # an fp32 prefill: paddle's matmul (module doc)
    if not shape or shape[-1] != d_in:
        raise ValueError(f"dense16 linear: x {list(shape)} has {shape[-1] if shape else 0} input features, "
                         f"the weight [{d_in}, {d_out}] expects {d_in}")
    # no reshape / copy when x is already contiguous [M, K] (the decode case)
    x2 = x if len(shape) == 2 else x.reshape([-1, d_in])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    if kernel == "auto":
        # below GEMM_MIN_ROWS (and for fp16, or without avx512_bf16) the stream kernel, resolved here so
        # tests can move the threshold; from it the op's own choice (kDense16Auto: AMX-BF16 where the CPU
        # has it, else the vdpbf16ps GEMM), which is the one fd_x86_decoder_layers makes for a 16-bit
        # linear or head in a run: a row's result does not depend on which path ran
        gemm = x2.shape[0] >= GEMM_MIN_ROWS and str(weight.dtype) == "paddle.bfloat16" and _has_bf16_dot()
        kernel = "auto" if gemm else "stream"
    out = load_ops().fd_x86_dense16_linear(x2, weight, threads or num_threads(), KERNELS[kernel])
    if len(shape) != 2:
        out = out.reshape(list(shape[:-1]) + [d_out])
    if bias is not None:
        out = out + (bias if str(bias.dtype) == "paddle.float32" else bias.astype("float32"))
    return out
