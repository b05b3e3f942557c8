"""What this CPU can run, and which kernel each method gets (no paddle).

The C++ op picks its kernel the same way at run time
(``__builtin_cpu_supports``); this module mirrors it so the listing can say
what will run without loading the op.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

__all__ = ["AMX_MIN_ROWS", "AVX512_FLAGS", "CpuFeatures", "DENSE16_GEMM_MIN_ROWS", "DENSE16_PANEL_MAX_N", "DENSE16_PANEL_MIN_ROWS", "KernelChoice", "amx_enabled", "choose_kernels", "cpu_features"]

AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")  # the 16-bit dense and KV kernels
AVX512_VNNI_FLAGS = (*AVX512_FLAGS, "avx512_vnni")
AVX512_BF16_FLAG = "avx512_bf16"  # vdpbf16ps: the bf16 dense GEMM (fd_x86.dense16)
AVX512_VBMI_FLAG = "avx512vbmi"  # vpermi2b: wint8 codes to bf16 by byte tables (csrc/kernels_int8_bf16.cc)
# kernels.h's kDense16GemmMinRows: bf16 dense calls with this many rows run the GEMM
DENSE16_GEMM_MIN_ROWS = 16
DENSE16_PANEL_MIN_ROWS, DENSE16_PANEL_MAX_N = 16, 8192  # kernels.h kDense16PanelMinRows, kDense16PanelMaxN
AVX2_FLAGS = ("avx2", "fma")
AMX_FLAGS = ("amx_tile", "amx_int8")
AMX_BF16_FLAGS = ("amx_tile", "amx_bf16", AVX512_BF16_FLAG)  # the AMX-BF16 dense GEMM (kernels_amx_bf16.cc)
# x86_linear_op.cc's kAmxMinRows: packed w8a8 calls with at least this many
# rows (and K % 64 == 0) run the AMX kernel where the CPU has AMX
AMX_MIN_ROWS = 12
# the fp32 ops x86_ops.cc answers (kernels_ops.cc, AVX2 + FMA on either ISA)
DECODE_OPS = ("fp32 native: rms_norm (+residual), silu_and_mul, rotary, kv-cache write, fused qkv->rope->cache "
              "(avx2), paged decode and prefill attention (avx512 where the CPU has it, else avx2)")


@dataclass(frozen=True)
class CpuFeatures:
    model: str
    flags: frozenset[str]

    def has(self, *names: str) -> bool:
        return all(name in self.flags for name in names)


@functools.lru_cache(maxsize=1)
def cpu_features() -> CpuFeatures:
    """Flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    model, flags = "", frozenset[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags":
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return CpuFeatures(model, flags)


@dataclass(frozen=True)
class KernelChoice:
    """The ISA the ops will use here, or why none can."""

    isa: str | None  # "avx512" | "avx2" | None
    summary: tuple[str, ...]  # one line per method family, for the listing
    reason: str = ""  # why isa is None


def amx_enabled(features: CpuFeatures) -> bool:
    """The op's choice (x86_linear_op.cc): AMX-TILE + AMX-INT8 + AVX-512 VNNI
    and ``FD_X86_AMX`` not "0". The op also needs the OS to grant the tile
    data (Linux >= 5.16), which only the op asks for."""
    return features.has(*AMX_FLAGS, *AVX512_VNNI_FLAGS) and os.environ.get("FD_X86_AMX") != "0"


def _dense16_line(features: CpuFeatures) -> str:
    """fd_x86.dense16's kernels here (FD_X86_DENSE16=0 turns them off)."""
    if os.environ.get("FD_X86_DENSE16") == "0":
        return "bf16/fp16 dense: off (FD_X86_DENSE16=0), fd-core reference"
    if features.has(*AMX_BF16_FLAGS) and os.environ.get("FD_X86_AMX") != "0":
        gemm = (f"AMX-BF16 tiles (tdpbf16ps, 32x32) from {DENSE16_GEMM_MIN_ROWS} rows (matrices of 64M+ "
                "elements from 32; FD_X86_AMX=0: avx512-bf16 vdpbf16ps)")
    elif features.has(AVX512_BF16_FLAG):
        amx = "AMX off: FD_X86_AMX=0" if features.has(*AMX_BF16_FLAGS) else "no AMX-BF16 on this CPU"
        gemm = f"avx512-bf16 vdpbf16ps GEMM from {DENSE16_GEMM_MIN_ROWS} rows ({amx})"
    else:
        gemm = f"no {AVX512_BF16_FLAG}: the fp32 panels at every M from {DENSE16_PANEL_MIN_ROWS}"
    return (f"bf16/fp16/fp32 dense: avx512 fp32 FMA on weights widened in registers, or in fp32 panels from "
            f"{DENSE16_PANEL_MIN_ROWS} rows (16-bit weights wider than {DENSE16_PANEL_MAX_N} outputs from "
            f"{DENSE16_GEMM_MIN_ROWS}; fp32 weights read in place at every M); bf16: {gemm}")


def _bf16_act_line(features: CpuFeatures) -> str:
    if not features.has(AVX512_BF16_FLAG):
        return "wint4/wint8 on bf16 activations: no avx512_bf16 on this CPU, the fp32 FMA kernels"
    switches = (("wint4", "FD_X86_INT4_BF16"), ("wint8", "FD_X86_INT8_BF16"))
    on = [m for m, var in switches if os.environ.get(var) != "0"]
    off = [(m, var) for m, var in switches if os.environ.get(var) == "0"]
    if not on:
        return ("wint4/wint8 on bf16 activations: off (" + ", ".join(f"{var}=0" for _, var in off)
                + "), the fp32 FMA kernels")
    line = (f"{'/'.join(on)} on bf16 activations (--dtype bfloat16): avx512-bf16 vdpbf16ps, the activations "
            "rounded to bf16 at the linear")
    if "wint8" in on and features.has(AVX512_VBMI_FLAG) and os.environ.get("FD_X86_INT8_BF16_TABLES") != "0":
        line += " (wint8 codes to bf16 by avx512-vbmi byte tables at 1-4 rows and in panels)"
    if off:
        return line + "".join(f"; {m}: off ({var}=0), the fp32 FMA kernels" for m, var in off)
    return line + " (FD_X86_INT4_BF16=0 / FD_X86_INT8_BF16=0: fp32 FMA)"


def choose_kernels(features: CpuFeatures | None = None) -> KernelChoice:
    features = features or cpu_features()
    if features.has(*AVX512_VNNI_FLAGS):
        if amx_enabled(features):
            w8a8 = (f"w8a8: AMX-int8 tiles (tdpbsud, 32x32) for M >= {AMX_MIN_ROWS} (K % 64 == 0), "
                    "avx512-vnni vpdpbusd 8x32 tiles below, on repacked weights (FD_X86_AMX=0: vnni only)")
        else:
            amx = "AMX off: FD_X86_AMX=0" if features.has(*AMX_FLAGS) else "no AMX on this CPU"
            w8a8 = f"w8a8: avx512-vnni vpdpbusd on repacked weights, 8x32 tiles ({amx})"
        return KernelChoice("avx512", (
            w8a8,
            "wint8/wint4: avx512 fp32 FMA, weights dequantized in registers",
            _dense16_line(features),
            _bf16_act_line(features),
            DECODE_OPS,
        ))
    if features.has(*AVX2_FLAGS):
        missing = [f for f in AVX512_VNNI_FLAGS if f not in features.flags]
        return KernelChoice("avx2", (
            f"w8a8: avx2 vpmaddubsw (no {', '.join(missing)})",
            "wint8/wint4: avx2 fp32 FMA, weights dequantized in registers",
            DECODE_OPS,
        ))
    return KernelChoice(None, (), reason=(
        f"this CPU ({features.model or 'unknown'}) has no AVX2+FMA, which fd-x86's kernels need; "
        "use fd-core's cpu backend (--backend cpu)"
    ))
