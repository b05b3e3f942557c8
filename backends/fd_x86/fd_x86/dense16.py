"""Unquantized linears (``--dtype bfloat16|float16|float32``) on fd_x86's kernels.

``dense16_linear(x, weight, bias)`` computes fd-core's ``reference_linear``
(``x [..., K] @ W [K, N] + bias``, fp32 out) on a bfloat16 / float16 / float32
weight in the reference's own layout, read in place, in its dtype, once per
call: no fp32 copy of a 16-bit weight and no repacked one is kept
(``csrc/kernels_dense16.cc``, ``csrc/kernels_dense16_gemm.cc``):

- stream (one row; a 16-bit weight wider than ``PANEL_MAX_N`` outputs, the LM
  head, below ``GEMM_MIN_ROWS``; every call below ``PANEL_MIN_ROWS``; an fp32
  weight at every size): the
  weight is widened to fp32 in registers (fp32 is read as it is) and multiplied
  with fp32 FMAs, so each product is the reference's exactly and the result
  differs from it only by the fp32 summation order (about 1e-6 of ``|x| @ |W|``).
  At one row (a decode step at batch 1) each thread reads a contiguous run of
  the weight's rows into its own partial sums, added in thread order: one
  sequential stream per thread, near the machine's read bandwidth (2-4 rows
  too). From 5 rows an fp32 weight is read where it lies by register tiles of
  8 rows x 48 outputs (the 0.3B's fp32 decode step 1.6x at B=8 and B=32 against
  the old stream tiles / panels; 1.04-1.13x the panels alone at 512-2048 rows);
- panel (from ``PANEL_MIN_ROWS`` rows where the bf16 GEMM is not taken: fp16
  weights at any size, bf16 below ``GEMM_MIN_ROWS``): the same arithmetic,
  bit for bit equal to the stream kernel from 2 rows, on the weight widened into
  fp32 panels per thread (register tiles of 6 rows x 64 outputs, ~0.98 of the FMA
  peak from 64 rows);
- bf16 GEMM (bf16 weights, M >= ``GEMM_MIN_ROWS``, CPUs with avx512_bf16):
  ``vdpbf16ps`` on x rounded to bf16 (round to nearest even) and W packed per
  thread into scratch panels. A product of two bf16s is exact in fp32, so the
  only extra error is x's rounding: ``|out - ref| <= 2**-9 * (|x| @ |W|)``
  plus fp32 summation (``GEMM_REL_ERR``).

It returns None, and fd-core's reference answers, where it does not apply:
a weight that is not a contiguous 2-D bf16 / fp16 / fp32 CPU tensor, x not
fp32, a CPU without AVX-512 F/BW/VL/DQ, or ``FD_X86_DENSE16=0`` in the
environment.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from fd_core.backends.cpu import num_threads
from fd_x86.build import load_ops
from fd_x86.cpu import (
    AVX512_BF16_FLAG,
    AVX512_FLAGS,
    DENSE16_GEMM_MIN_ROWS,
    DENSE16_PANEL_MAX_N,
    DENSE16_PANEL_MIN_ROWS,
    cpu_features,
)

__all__ = ["GEMM_MIN_ROWS", "GEMM_REL_ERR", "KERNELS", "PANEL_MAX_N", "PANEL_MIN_ROWS", "dense16_enabled",
           "dense16_linear"]

KERNELS = {"auto": 0, "stream": 1, "gemm": 2, "panel": 4}  # the op's ``kernel`` attribute
# bf16 calls with this many rows run the GEMM (as kernels.h's kDense16GemmMinRows).
# Measured on Zen 4, 1 thread, W [1024, 3072] read from DRAM: stream / GEMM
# 0.39 / 0.58 ms at 8 rows, 0.62 / 0.64 at 12, 0.78 / 0.67 at 16, 1.55 / 0.91
# at 32 (the GEMM's packing reads W at ~12 GB/s; from cache the GEMM wins from 3 rows)
GEMM_MIN_ROWS = DENSE16_GEMM_MIN_ROWS
# from this many rows the panel kernel where the bf16 GEMM is not taken, a 16-bit weight wider than PANEL_MAX_N
# outputs only from GEMM_MIN_ROWS (kernels.h kDense16PanelMinRows, kDense16PanelMaxN)
PANEL_MIN_ROWS, PANEL_MAX_N = DENSE16_PANEL_MIN_ROWS, DENSE16_PANEL_MAX_N
GEMM_REL_ERR = 2.0**-9  # the GEMM's bound, relative to |x| @ |W| (x rounded to bf16)
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


def _kernel(rows: int, dtype: str, n: int) -> str:
    """The stream or panel kernel where the bf16 GEMM is not taken, resolved here so tests can move the
    thresholds; else "auto": the op's own choice (kDense16Auto: AMX-BF16 where the CPU has it, else the
    vdpbf16ps GEMM). The rules are kernels.h's, which fd_x86_decoder_layers follows for a linear or head in
    a run, so a row's result does not depend on which path ran."""
    if rows >= GEMM_MIN_ROWS and dtype == "paddle.bfloat16" and _has_bf16_dot():
        return "auto"
    if rows < PANEL_MIN_ROWS or dtype == "paddle.float32" or (rows < GEMM_MIN_ROWS and n > PANEL_MAX_N):
        return "stream"
    return "panel"


def dense16_linear(x: Any, weight: Any, bias: Any | None = None, kernel: str = "auto",
                   threads: int | None = None) -> Any | None:
    """``x [..., K] @ weight [K, N] (+ bias)`` as fp32 ``[..., N]``, or None
    where the native kernels do not apply (see the module doc). ``kernel``
    forces "stream", "panel" or "gemm" (tests); ``threads`` defaults to fd-core's CPU
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
    if not shape or shape[-1] != d_in:
        raise ValueError(f"dense16 linear: x {list(shape)} has {shape[-1] if shape else 0} input features, "
                         f"the weight [{d_in}, {d_out}] expects {d_in}")
    # no reshape / copy when x is already contiguous [M, K] (the decode case)
    x2 = x if len(shape) == 2 else x.reshape([-1, d_in])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    if kernel == "auto":
        kernel = _kernel(x2.shape[0], str(weight.dtype), d_out)
    out = load_ops().fd_x86_dense16_linear(x2, weight, threads or num_threads(), KERNELS[kernel])
    if len(shape) != 2:
        out = out.reshape(list(shape[:-1]) + [d_out])
    if bias is not None:
        out = out + (bias if str(bias.dtype) == "paddle.float32" else bias.astype("float32"))
    return out
