// The work split of the packed-layout kernels (kernels_avx512.cc's layouts,
// blocks of 16 output channels), shared by the AVX-512 TUs that run them
// (kernels_avx512.cc, kernels_int4_bf16.cc). Included *after* the TU's
// `#pragma GCC target` and tiling.h, so it is compiled for that ISA;
// internal linkage only (see kernels.h).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "tiling.h"

namespace {

using fdx86::LinearArgs;

inline __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

// Software prefetch this many bytes ahead in each weight stream: at a few
// rows the kernels convert weights about as fast as DRAM delivers them, and
// the hardware prefetcher alone left ~20% of the bandwidth unused (measured
// on Zen 4 at 1 row: 18.7 -> 15.0 ms for 361 MB of wint8 weights).
constexpr int64_t kPrefetchAhead = 1024;

inline void prefetch_ahead(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchAhead, _MM_HINT_T0);
}

template <class Kern, int NB, int R>
inline void packed_rows_tail(const LinearArgs& a, int64_t m, int64_t rest, int64_t nb0) {
  if constexpr (R > 0) {
    if (rest == R) Kern::template tile<R, NB>(a, m, nb0);
    else packed_rows_tail<Kern, NB, R - 1>(a, m, rest, nb0);
  }
}

template <class Kern, int NB>
inline void packed_rows(const LinearArgs& a, int64_t m0, int64_t m1, int64_t nb0) {
  int64_t m = m0;
  for (; m + Kern::kMaxRows <= m1; m += Kern::kMaxRows) Kern::template tile<Kern::kMaxRows, NB>(a, m, nb0);
  if (m < m1) packed_rows_tail<Kern, NB, Kern::kMaxRows - 1>(a, m, m1 - m, nb0);
}

template <class Kern, int NB>
inline void packed_blocks(const LinearArgs& a, int64_t m0, int64_t m1, int64_t nb0, int64_t nb) {
  if constexpr (NB > 0) {
    if (nb == NB) packed_rows<Kern, NB>(a, m0, m1, nb0);
    else packed_blocks<Kern, NB - 1>(a, m0, m1, nb0, nb);
  }
}

// Work items of Kern::kBlocks 16-channel blocks, over the threads
template <class Kern>
void drive_packed(const LinearArgs& a) {
  constexpr int64_t kBlocks = Kern::kBlocks;
  const int64_t blocks = (a.N + 15) / 16;
  const int64_t chunks = (blocks + kBlocks - 1) / kBlocks;
  const bool parallel = a.threads > 1 && chunks > 1 && a.M * a.N * a.K >= kMinParallelMacs;
#pragma omp parallel for schedule(static) num_threads(a.threads) if (parallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t nb0 = c * kBlocks, nb = min64(kBlocks, blocks - nb0);
    for (int64_t m0 = 0; m0 < a.M; m0 += kRowChunk)
      packed_blocks<Kern, Kern::kBlocks>(a, m0, min64(m0 + kRowChunk, a.M), nb0, nb);
  }
}

// y[m + i, 16 (nb0 + j) ...] = v, masked at N
inline void store16(const LinearArgs& a, int64_t row, int64_t block, __m512 v) {
  const int64_t n = block * 16;
  _mm512_mask_storeu_ps(a.out + row * a.N + n, mask16(a.N - n), v);
}

}  // namespace
