#!/usr/bin/env bash
# Build benchmarks/x86_prefetch/prefetch_bench.cc once per software-prefetch
# distance set and run the builds in turn (no paddle, ~1 minute to build).
# A set is "words:w4a8:lut" bytes ahead for the packed int4 words kernel, the
# w4a8 expert kernel and the wint4 LUT expert kernel. The default compares
# the distances before session 13 (words none, ~one tile, 512) with today's
# (1024, 8192, 8192) and a farther set. Since session 18 the words kernel
# prefetches only in tiles of 2+ rows, so at the bench's one row its column
# no longer moves with the set. THREADS (default "2"), REPEATS (5),
# ROUNDS (2), BUILD_DIR (default: a temporary directory).
#   bash benchmarks/x86_prefetch/run.sh [SET ...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
csrc="$here/../../backends/fd_x86/fd_x86/csrc"
out="${BUILD_DIR:-$(mktemp -d)}"
sets=("$@")
[[ ${#sets[@]} -gt 0 ]] || sets=("none:2048:512" "1024:8192:8192" "2048:16384:16384")
grep -m1 "model name" /proc/cpuinfo || true
for set in "${sets[@]}"; do
  IFS=: read -r words w4a8 lut <<<"$set"
  dir="$out/$set"
  mkdir -p "$dir"
  cp "$csrc"/*.h "$dir/"
  # none: the prefetch removed (the words kernel had none before session 13)
  sed_for() {  # FILE VALUE
    if [[ "$2" == none ]]; then
      sed -e '/_mm_prefetch(.*kPrefetchAhead/d' -e '/pf\.next();/d' "$csrc/$1" >"$dir/$1"
    else
      sed -e "s/constexpr int64_t kPrefetchAhead = [0-9]*;/constexpr int64_t kPrefetchAhead = $2;/" "$csrc/$1" >"$dir/$1"
    fi
  }
  sed_for kernels_prefill_avx512.cc "$words"
  sed_for kernels_w4a8_avx512.cc "$w4a8"
  sed_for kernels_moe_avx512.cc "$lut"
  "${CXX:-g++}" -O3 -std=c++17 -fopenmp -I"$dir" "$here/prefetch_bench.cc" "$dir/kernels_prefill_avx512.cc" \
    "$dir/kernels_w4a8_avx512.cc" "$dir/kernels_moe_avx512.cc" "$csrc/kernels_cpu.cc" "$csrc/kernels_avx512.cc" \
    -o "$dir/bench" &
done
wait
for round in $(seq "${ROUNDS:-2}"); do
  for threads in ${THREADS:-2}; do
    for set in "${sets[@]}"; do
      echo "== round $round, prefetch words:w4a8:lut = $set"
      if [[ "$threads" == 2 ]] && command -v taskset >/dev/null; then
        OMP_NUM_THREADS=2 taskset -c 0,1 "$out/$set/bench" 2 "${REPEATS:-5}"
      else
        OMP_NUM_THREADS="$threads" "$out/$set/bench" "$threads" "${REPEATS:-5}"
      fi
    done
  done
done
