#!/usr/bin/env bash
# Build the AMX harnesses (no paddle): check AMX-int8 == VNNI bit for bit, and
# the AMX-BF16 and vdpbf16ps bf16 GEMMs against a double-precision product of
# the same bf16 operands; with --bench, also time the 0.3B's matmuls on 2
# (cores 0,1) and 16 threads. BUILD_DIR (default: ./build beside this script)
# holds the binaries.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
csrc="$here/../../fd_x86/csrc"
out="${BUILD_DIR:-$here/build}"
mkdir -p "$out"
"${CXX:-g++}" -O3 -std=c++17 -fopenmp -I"$csrc" "$here/harness.cc" \
  "$csrc/kernels_avx512.cc" "$csrc/kernels_amx.cc" "$csrc/kernels_cpu.cc" -o "$out/harness"
OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" "$out/harness" check
"${CXX:-g++}" -O3 -std=c++17 -fopenmp -I"$csrc" "$here/dense16_amx.cc" \
  "$csrc/kernels_dense16.cc" "$csrc/kernels_dense16_gemm.cc" "$csrc/kernels_amx_bf16.cc" "$csrc/kernels_cpu.cc" -o "$out/dense16_amx"
OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" "$out/dense16_amx" check
if [[ "${1:-}" == "--bench" ]]; then
  OMP_NUM_THREADS=2 taskset -c 0,1 "$out/harness" bench 2
  OMP_NUM_THREADS=16 "$out/harness" bench 16
  OMP_NUM_THREADS=2 taskset -c 0,1 "$out/dense16_amx" bench 2
  OMP_NUM_THREADS=16 "$out/dense16_amx" bench 16
fi
