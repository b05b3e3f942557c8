// AVX-512 kernels for the routed experts (moe_kernels.h). Compiled for that
// ISA by the pragma below and only called after __builtin_cpu_supports says so.
#include <immintrin.h>

#include <cstdint>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

#include "moe_kernels.h"
#include "tiling.h"

namespace {
// Software prefetch this many bytes ahead in each channel's stream: 512 left a mid-size MoE decode step with
// wint4 experts 1.12x slower at B = 1 and 1.09x at B = 8, a 21B-wide one 1.05x, than 8 KiB (4 KiB: 1.02x
// slower, 16 KiB: 1.02x; Zen 4, 2 threads). A tile's NB channels are adjacent rows, one stream: the
// prefetches walk it in address order, a line per load, rather than each row at its own position (the same
// lines). B=1 decode steps with wint4 experts, same process: mid-size MoE 1.07x faster (fp32 activations)
// and 1.13x (bf16, kernels_int4_bf16.cc), a 4-layer model of the 21B's widths 1.09x (bf16); B=8 0.98-1.01x.
constexpr int64_t kPrefetchAhead = 8192;

using fdx86::LinearArgs;
using fdx86::kWint4LutBlock;

// See moe_kernels.h. Tiles of MB rows x NB channels; registers at 4 x 4:
// 16 accumulators, 4 tables, 4 code vectors, 4 x vectors, 1 temporary.
struct Wint4Lut {
  static constexpr int kMaxRows = 4;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n) {
    const int64_t K = a.K, Kh = K / 2, blocks_per_group = a.group_size / kWint4LutBlock;
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + n * Kh;
    RunPrefetch pf(w, kPrefetchAhead);  // the tile's rows in address order (tiling.h)
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    __m512 acc[MB][NB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    const int64_t nblocks = K / kWint4LutBlock;
    __m512 lut[NB];
    for (int64_t b = 0; b < nblocks; ++b) {
      if (b % blocks_per_group == 0) {
        const int64_t g = b / blocks_per_group;
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) lut[j] = _mm512_mul_ps(values, _mm512_set1_ps(a.scales[(n + j) * a.groups + g]));
      }
      __m512i v[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const uint8_t* p = w + j * Kh + b * 64;
        pf.next();
        v[j] = _mm512_loadu_si512(p);
      }
      const float* xb = a.xe + m * K + b * kWint4LutBlock;
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
        __m512 xv[MB];
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i) xv[i] = _mm512_loadu_ps(xb + i * K + t * 16);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          const __m512 f = _mm512_permutexvar_ps(v[j], lut[j]);  // low 4 bits of each lane index
          if (t < 7) v[j] = _mm512_srli_epi32(v[j], 4);
#pragma GCC unroll 4
          for (int i = 0; i < MB; ++i) acc[i][j] = _mm512_fmadd_ps(xv[i], f, acc[i][j]);
        }
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) a.out[(m + i) * a.N + n + j] = _mm512_reduce_add_ps(acc[i][j]);
  }
};

}  // namespace

namespace fdx86 {

void wint4_lut_permute(const float* x, int64_t M, int64_t K, float* xp) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < K; b += kWint4LutBlock) {
      const float* src = x + m * K + b;
      float* dst = xp + m * K + b;
      for (int t = 0; t < 8; ++t)
        for (int l = 0; l < 16; ++l) dst[16 * t + l] = src[8 * l + t];
    }
  }
}

void wint4_lut_avx512(const LinearArgs& a) { drive<Wint4Lut>(a); }

void router_logits_avx512(const float* x, int64_t T, int64_t D, const float* gate, int64_t E, float* out,
                          int threads) {
  constexpr int kChunks = 4;  // 64 experts per pass over the gate
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && T * D * E >= kMinParallelMacs)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * D;
    for (int64_t e0 = 0; e0 < E; e0 += 16 * kChunks) {
      __m512 acc[kChunks];
      __mmask16 mk[kChunks];
      for (int c = 0; c < kChunks; ++c) {
        acc[c] = _mm512_setzero_ps();
        const int64_t left = E - e0 - 16 * c;
        mk[c] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
      }
      for (int64_t d = 0; d < D; ++d) {
        const __m512 xv = _mm512_set1_ps(xr[d]);
        const float* g = gate + d * E + e0;
#pragma GCC unroll 4
        for (int c = 0; c < kChunks; ++c)
          if (mk[c]) acc[c] = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(mk[c], g + 16 * c), acc[c]);
      }
      for (int c = 0; c < kChunks; ++c)
        if (mk[c]) _mm512_mask_storeu_ps(out + t * E + e0 + 16 * c, mk[c], acc[c]);
    }
  }
}

}  // namespace fdx86
