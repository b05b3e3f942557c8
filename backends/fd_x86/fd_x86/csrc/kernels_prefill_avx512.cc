// AVX-512 VNNI kernels for the opt-in int8-activation prefill path
// (prefill_kernels.h). Compiled for that ISA by the pragma below and only
// called after __builtin_cpu_supports says so.
#include <immintrin.h>

#include <cstdint>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")

#include "prefill_kernels.h"

namespace {

using fdx86::LinearArgs;

constexpr int kRows = 4;     // register tile: rows of x
constexpr int kBlocks = 4;   // x blocks of 16 output channels (a work item)
static_assert(kWordGroup % kBlocks == 0, "a work item's blocks must lie in one word group");
constexpr int64_t kRowPass = 64;  // rows per pass over a work item's weights (they stay in L2)

// Software prefetch this many bytes ahead in the work item's weight stream,
// in tiles of more than one row. With a stream per block (before the word
// groups) it made one-row w4a8 decode steps 1.04-1.09x faster; with one
// stream per item the hardware prefetcher alone is faster at one row (the
// 0.3B's B=1 step 1.15x, same process, Zen 4, 2 threads) and prefetching
// still wins at 8 rows (1.02x): kernels.h's kWordGroup.
constexpr int64_t kPrefetchAhead = 1024;

inline __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

// MB rows x NB blocks starting at row m, block nb0. Per group: int32 dot
// products of (code + 8) with xq, then (dot - 8 * gsum) * scale into fp32.
template <int MB, int NB>
inline void tile(const LinearArgs& a, int64_t m, int64_t nb0) {
  const int64_t G = a.groups, words_per_group = a.group_size / 8;
  const WordBlock wb = word_block(a.w, a.N, a.K, nb0);
  const __m512i flip = _mm512_set1_epi32(static_cast<int>(0x88888888u));
  const __m512i low4 = _mm512_set1_epi32(0x0F0F0F0F);
  __m512 facc[MB][NB];
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) facc[i][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i acc[MB][NB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_si512();
    const int64_t kb0 = g * words_per_group, kb1 = kb0 + words_per_group;
    for (int64_t kb = kb0; kb < kb1; ++kb) {
      __m512i lo[NB], hi[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const uint32_t* p = wb.first + kb * wb.stride + j * 16;
        if constexpr (MB > 1) _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchAhead, _MM_HINT_T0);
        const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(p), flip);
        lo[j] = _mm512_and_si512(v, low4);
        hi[j] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
      }
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        const int32_t* xr = reinterpret_cast<const int32_t*>(a.xq + (m + i) * a.ldq + kb * 8);
        const __m512i xl = _mm512_set1_epi32(xr[0]), xh = _mm512_set1_epi32(xr[1]);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], lo[j], xl);
          acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], hi[j], xh);
        }
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) {
      const __m512i corr = _mm512_set1_epi32(8 * a.xsum[(m + i) * G + g]);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const __m512 s = _mm512_loadu_ps(a.scales + ((nb0 + j) * G + g) * 16);
        facc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], corr)), s, facc[i][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i) {
    const __m512 xs = _mm512_set1_ps(a.xscale[m + i]);
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const int64_t n = (nb0 + j) * 16;
      if (n < a.N) _mm512_mask_storeu_ps(a.out + (m + i) * a.N + n, mask16(a.N - n), _mm512_mul_ps(facc[i][j], xs));
    }
  }
}

template <int NB>
inline void rows(const LinearArgs& a, int64_t m0, int64_t m1, int64_t nb0) {
  int64_t m = m0;
  for (; m + kRows <= m1; m += kRows) tile<kRows, NB>(a, m, nb0);
  switch (m1 - m) {
    case 1: tile<1, NB>(a, m, nb0); break;
    case 2: tile<2, NB>(a, m, nb0); break;
    case 3: tile<3, NB>(a, m, nb0); break;
    default: break;
  }
}

}  // namespace

namespace fdx86 {

void wint4_vnni_prepare_avx512(int8_t* xq, int64_t M, int64_t K, int64_t ldq, int64_t group_size, int64_t groups,
                               int32_t* gsum, int threads) {
  // within each 128-bit lane: bytes 0 2 4 6 1 3 5 7, 8 10 12 14 9 11 13 15
  const __m512i order = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && M * K >= (1 << 16))
  for (int64_t m = 0; m < M; ++m) {
    int8_t* r = xq + m * ldq;
    for (int64_t g = 0; g < groups; ++g) {
      int32_t s = 0;
      for (int64_t k = g * group_size; k < (g + 1) * group_size && k < K; ++k) s += r[k];
      gsum[m * groups + g] = s;
    }
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
      const __m512i v = _mm512_loadu_si512(r + k);
      _mm512_storeu_si512(r + k, _mm512_shuffle_epi8(v, order));
    }
    for (; k < K; k += 8) {
      int8_t t[8];
      for (int i = 0; i < 8; ++i) t[i] = r[k + i];
      for (int i = 0; i < 4; ++i) {
        r[k + i] = t[2 * i];
        r[k + 4 + i] = t[2 * i + 1];
      }
    }
  }
}

void wint4_words_vnni_avx512(const LinearArgs& a) {
  const int64_t nblocks = (a.N + 15) / 16, items = (nblocks + kBlocks - 1) / kBlocks;
  const bool parallel = a.threads > 1 && items > 1;
#pragma omp parallel for schedule(static) num_threads(a.threads) if (parallel)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t nb0 = it * kBlocks, nb = nblocks - nb0 < kBlocks ? nblocks - nb0 : kBlocks;
    for (int64_t m0 = 0; m0 < a.M; m0 += kRowPass) {
      const int64_t m1 = m0 + kRowPass < a.M ? m0 + kRowPass : a.M;
      switch (nb) {
        case 4: rows<4>(a, m0, m1, nb0); break;
        case 3: rows<3>(a, m0, m1, nb0); break;
        case 2: rows<2>(a, m0, m1, nb0); break;
        default: rows<1>(a, m0, m1, nb0); break;
      }
    }
  }
}

}  // namespace fdx86
