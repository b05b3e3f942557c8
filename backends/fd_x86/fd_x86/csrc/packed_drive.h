// The work split of the packed-layout kernels (kernels_avx512.cc's layouts,
// blocks of 16 output channels), shared by the AVX-512 TUs that run them
// (kernels_avx512.cc, kernels_int4_bf16.cc, kernels_int8_bf16.cc), and the word layout's int4 tile
// both run with their own inner step. Included *after* the TU's
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
// Into L2 (T1): see tiling.h's RunPrefetch.
constexpr int64_t kPrefetchAhead = 1024;

inline void prefetch_ahead(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchAhead, _MM_HINT_T1);
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

// item(nb0, nb) for each work item of kBlocks 16-channel blocks (nb of them from block nb0; the
// last may be short), over the threads
template <int64_t kBlocks, class Item>
inline void packed_items(const LinearArgs& a, Item item) {
  const int64_t blocks = (a.N + 15) / 16;
  const int64_t chunks = (blocks + kBlocks - 1) / kBlocks;
  const bool parallel = a.threads > 1 && chunks > 1 && a.M * a.N * a.K >= kMinParallelMacs;
#pragma omp parallel for schedule(static) num_threads(a.threads) if (parallel)
  for (int64_t c = 0; c < chunks; ++c) item(c * kBlocks, min64(kBlocks, blocks - c * kBlocks));
}

// Work items of Kern::kBlocks 16-channel blocks, over the threads
template <class Kern>
void drive_packed(const LinearArgs& a) {
  packed_items<Kern::kBlocks>(a, [&a](int64_t nb0, int64_t nb) {
    for (int64_t m0 = 0; m0 < a.M; m0 += kRowChunk)
      packed_blocks<Kern, Kern::kBlocks>(a, m0, min64(m0 + kRowChunk, a.M), nb0, nb);
  });
}

// [sum(a), sum(b), sum(c), sum(d)]: each vector's lanes summed in one tree, whatever its
// position or its companions (their lanes are only packed beside its own)
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3), same for c, d
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  // per lane: (a, b, c, d) partial sums
  const __m512 abcd = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                                    _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(abcd),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// y[m + i, 16 (nb0 + j) ...] = v, masked at N
inline void store16(const LinearArgs& a, int64_t row, int64_t block, __m512 v) {
  const int64_t n = block * 16;
  _mm512_mask_storeu_ps(a.out + row * a.N + n, mask16(a.N - n), v);
}

// The word layout's tile (wint4 in words, see kernels_avx512.cc: word (kb, c)
// = channel c's codes of inputs 8kb .. 8kb+7, input 8kb+t in bits 4t..4t+3)
// for MB rows x NB 16-channel blocks: per group, the codes' products summed
// into fp32 group sums (two sets, even / odd steps, at 1-2 rows: latency),
// then scaled into the accumulators in group order. `Codes` is what a word's
// codes multiply: Codes(a, m) for the tile's rows; kSteps steps per word, each
// `codes(v)` (the word's low 4 bits as the products' weight operand) and
// `madd(s, w, i, kb, t)` (row i's products of step t of word kb added to s);
// the word shifts right by 4 bits between steps (bf16 takes codes t and t+4
// from a word's two halves, so it needs 4 steps, fp32 8). Wint4Words (fp32
// activations) and Wint4WordsBf16 (bf16 activations, kernels_int4_bf16.cc).
template <class Codes, int Blocks, int MaxRows>
struct Wint4WordsTile {
  static constexpr int kMaxRows = MaxRows;
  static constexpr int kBlocks = Blocks;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t nb0) {
    constexpr int H = MB <= 2 ? 2 : 1;
    constexpr int S = Codes::kSteps;
    const int64_t K8 = a.K / 8, gw = a.group_size / 8, G = a.groups;
    static_assert(kWordGroup % Blocks == 0, "a work item's blocks must lie in one word group");
    const WordBlock wb = word_block(a.w, a.N, a.K, nb0);
    const float* sp = a.scales + nb0 * G * 16;
    const Codes codes(a, m);
    __m512 acc[MB][NB];
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const int64_t kb1 = min64((g + 1) * gw, K8);
      __m512 gacc[H][MB][NB];
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
        for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) gacc[h][i][j] = _mm512_setzero_ps();
      for (int64_t kb = g * gw; kb < kb1; ++kb) {
        __m512i v[NB];
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          const uint32_t* p = wb.first + kb * wb.stride + j * 16;
          if constexpr (MB > 1) prefetch_ahead(p);  // one row: kWordGroup's note in kernels.h
          v[j] = _mm512_loadu_si512(p);
        }
#pragma GCC unroll 8
        for (int t = 0; t < S; ++t) {
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) {
            const auto f = codes.codes(v[j]);
            if (t < S - 1) v[j] = _mm512_srli_epi32(v[j], 4);
#pragma GCC unroll 8
            for (int i = 0; i < MB; ++i) {
              __m512& s = gacc[H == 2 ? (t & 1) : 0][i][j];
              s = codes.madd(s, f, i, kb, t);
            }
          }
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const __m512 sc = _mm512_loadu_ps(sp + (j * G + g) * 16);
#pragma GCC unroll 8
        for (int i = 0; i < MB; ++i) {
          const __m512 sum = H == 2 ? _mm512_add_ps(gacc[0][i][j], gacc[H - 1][i][j]) : gacc[0][i][j];
          acc[i][j] = _mm512_fmadd_ps(sum, sc, acc[i][j]);
        }
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) store16(a, m + i, nb0 + j, acc[i][j]);
  }
};

}  // namespace
