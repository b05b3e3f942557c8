"""The AMX-int8 w8a8 kernel: the listing's choice, and the standalone
harness (tests/amx_harness: AMX == VNNI bit for bit) where the CPU has AMX."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fd_x86.build import CSRC
from fd_x86.cpu import (
    AMX_BF16_FLAGS,
    AMX_FLAGS,
    AMX_MIN_ROWS,
    AVX512_VNNI_FLAGS,
    CpuFeatures,
    choose_kernels,
    cpu_features,
)

HARNESS = Path(__file__).parent / "amx_harness" / "run.sh"
AVX512 = frozenset("avx2 fma avx512f avx512bw avx512vl avx512dq avx512_vnni".split())


def test_listing_reports_amx_for_amx_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FD_X86_AMX", raising=False)
    amx = CpuFeatures("test", AVX512 | set(AMX_FLAGS))
    choice = choose_kernels(amx)
    assert choice.isa == "avx512"
    assert choice.summary[0].startswith(f"w8a8: AMX-int8 tiles (tdpbsud, 32x32) for M >= {AMX_MIN_ROWS}")
    assert "K % 64 == 0" in choice.summary[0] and "avx512-vnni" in choice.summary[0]
    monkeypatch.setenv("FD_X86_AMX", "0")
    assert "AMX off: FD_X86_AMX=0" in choose_kernels(amx).summary[0]
    monkeypatch.delenv("FD_X86_AMX")
    assert "no AMX on this CPU" in choose_kernels(CpuFeatures("test", AVX512)).summary[0]
    # AMX without the AVX-512 VNNI the kernel's epilogue and the packing need: no AMX
    assert choose_kernels(CpuFeatures("test", frozenset({"avx2", "fma", *AMX_FLAGS}))).isa == "avx2"


def test_listing_reports_amx_bf16_for_bf16_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FD_X86_AMX", raising=False)
    monkeypatch.delenv("FD_X86_DENSE16", raising=False)
    amx = CpuFeatures("test", AVX512 | set(AMX_FLAGS) | set(AMX_BF16_FLAGS))
    assert "bf16: AMX-BF16 tiles (tdpbf16ps" in choose_kernels(amx).summary[2]
    monkeypatch.setenv("FD_X86_AMX", "0")
    assert "vdpbf16ps GEMM from 16 rows (AMX off: FD_X86_AMX=0)" in choose_kernels(amx).summary[2]
    monkeypatch.delenv("FD_X86_AMX")
    bf16_only = CpuFeatures("test", AVX512 | {"avx512_bf16"})
    assert "vdpbf16ps GEMM from 16 rows (no AMX-BF16 on this CPU)" in choose_kernels(bf16_only).summary[2]


@pytest.mark.slow  # builds both harnesses (~30 s on 2 cores)
def test_bf16_harness_against_double_products(tmp_path: Path) -> None:
    """The bf16 GEMMs this CPU has (AMX-BF16, vdpbf16ps) within the fp32
    summation bound of a double product of the same bf16 operands."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ to build the harness")
    if not cpu_features().has(*AVX512_VNNI_FLAGS):
        pytest.skip("the harness's kernels need AVX-512 (+ VNNI for the int8 part)")
    env = {**os.environ, "BUILD_DIR": str(tmp_path), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(["bash", str(HARNESS)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "0 beyond the bound" in proc.stdout


def test_row_threshold_matches_the_op() -> None:
    source = (CSRC / "x86_linear_op.cc").read_text()
    match = re.search(r"constexpr int64_t kAmxMinRows = (\d+);", source)
    assert match is not None and int(match.group(1)) == AMX_MIN_ROWS


@pytest.mark.skipif(not cpu_features().has(*AMX_FLAGS, *AVX512_VNNI_FLAGS),
                    reason="no AMX-TILE/AMX-INT8 (+ AVX-512 VNNI) on this CPU: the harness's AMX part cannot run")
@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build the harness")
def test_amx_harness_bit_exact(tmp_path: Path) -> None:
    env = {**os.environ, "BUILD_DIR": str(tmp_path), "OMP_NUM_THREADS": "4"}
    proc = subprocess.run(["bash", str(HARNESS)], env=env, capture_output=True, text=True, timeout=600)
    if "SKIP AMX part" in proc.stdout:
        pytest.skip(proc.stdout.splitlines()[0])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "PASSED" in proc.stdout and "amx vs vnni bit-exact" in proc.stdout


def test_listing_reports_the_bf16_activation_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    def line() -> str:
        return choose_kernels(CpuFeatures("test", AVX512 | {"avx512_bf16"})).summary[3]

    monkeypatch.delenv("FD_X86_INT4_BF16", raising=False)
    monkeypatch.delenv("FD_X86_INT8_BF16", raising=False)
    assert line().startswith("wint4/wint8 on bf16 activations") and "vdpbf16ps" in line()
    assert "no avx512_bf16 on this CPU" in choose_kernels(CpuFeatures("test", AVX512)).summary[3]
    monkeypatch.setenv("FD_X86_INT4_BF16", "0")
    assert line().startswith("wint8 on bf16") and "wint4: off (FD_X86_INT4_BF16=0)" in line()
    monkeypatch.setenv("FD_X86_INT8_BF16", "0")
    assert "off (FD_X86_INT4_BF16=0, FD_X86_INT8_BF16=0)" in line() and "vdpbf16ps" not in line()
    monkeypatch.delenv("FD_X86_INT4_BF16")
    assert line().startswith("wint4 on bf16") and "wint8: off (FD_X86_INT8_BF16=0)" in line()
