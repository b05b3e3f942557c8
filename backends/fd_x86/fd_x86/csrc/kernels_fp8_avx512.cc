// AVX-512 kernels for block-wise fp8 (fp8_kernels.h). Compiled for that ISA
// by the pragma below and only called after __builtin_cpu_supports says so.
//
// e4m3 -> fp32 in registers: AVX-512 has no fp8 arithmetic, but an e4m3
// magnitude shifted left by 7 is an fp16 with the same exponent and
// mantissa bits whose value is 2^-8 times the e4m3 value (subnormals
// included: fp16 subnormals are e4m3's scaled the same way), so
// vpmovsxbw + a shift and a mask + two vcvtph2ps decode 32 weights
// (vcvtph2ps ignores MXCSR.DAZ); the 2^8 is folded into the block scale.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#include "fp8_kernels.h"

namespace {

constexpr int64_t kBlock = 128;
constexpr int kRows = 2;  // rows of x per tile (x kChannels: 8 partials + 8 totals + 4 weights)
constexpr float kE4m3Max = 448.0f;
constexpr int64_t kDecodeOnceRows = 3;  // more rows: decode a work item's weights once, not per row tile
constexpr int64_t kChannels = 4;        // output channels per work item (independent FMA chains at one row)

inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

// 32 e4m3 codes (n <= 32 valid; the rest 0) -> their values / 256, as two
// halves of 16. Sign-extending a code to 16 bits and shifting it left by 7
// puts its sign at bit 15, exponent and mantissa at bits 7..13 (fp16's
// layout) and a copy of the sign at bit 14, which the mask clears.
inline void decode32(const uint8_t* p, int64_t n, __m512* lo, __m512* hi) {
  const __m256i bytes = n >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                : _mm256_maskz_loadu_epi8(n <= 0 ? 0u : (__mmask32)(0xFFFFFFFFu >> (32 - n)), p);
  const __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(bytes), 7),
                                     _mm512_set1_epi16(static_cast<short>(0xBF80)));
  *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

// round |a| <= 448 to the e4m3 grid, nearest even (exact: the grid spacing is a power of two)
inline __m512 round_e4m3(__m512 v) {
  const __m512 a = _mm512_abs_ps(v);
  const __m512 e = _mm512_max_ps(_mm512_getexp_ps(a), _mm512_set1_ps(-6.0f));  // floor(log2 a), subnormal floor
  const __m512 step_exp = _mm512_sub_ps(e, _mm512_set1_ps(3.0f));
  const __m512 q = _mm512_scalef_ps(a, _mm512_sub_ps(_mm512_setzero_ps(), step_exp));  // a / step
  const __m512 r = _mm512_scalef_ps(_mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), step_exp);
  return _mm512_or_ps(r, _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));  // the sign back
}

// MB rows of x from m against NB output channels from n: per 128-input
// group, fp32 partial dot products (MB * NB independent FMA chains), then
// scaled by the group's two scales into the totals.
// wbuf: nullptr (decode in registers; rows <= 3) or the NB rows already
// decoded ([NB][K] fp32, values / 256), read in place of the codes.
template <int MB, int NB>
void tile(const fdx86::Fp8LinearArgs& a, int64_t m, int64_t n, const float* wbuf) {
  const int64_t KB = (a.K + kBlock - 1) / kBlock;
  __m512 total[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) total[i][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < KB; ++g) {
    const int64_t k0 = g * kBlock, k1 = k0 + kBlock < a.K ? k0 + kBlock : a.K;
    __m512 part[MB][NB];
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j) part[i][j] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 32) {
      const int64_t left = k1 - k;
      const __mmask16 mlo = mask16(left), mhi = mask16(left - 16);
      __m512 wlo[NB], whi[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        if (wbuf != nullptr) {
          wlo[j] = _mm512_maskz_loadu_ps(mlo, wbuf + j * a.K + k);
          whi[j] = _mm512_maskz_loadu_ps(mhi, wbuf + j * a.K + k + 16);
        } else {
          decode32(a.w + (n + j) * a.K + k, left, &wlo[j], &whi[j]);
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        const float* xr = a.xq + (m + i) * a.K + k;
        const __m512 xl = _mm512_maskz_loadu_ps(mlo, xr), xh = _mm512_maskz_loadu_ps(mhi, xr + 16);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          part[i][j] = _mm512_fmadd_ps(xl, wlo[j], part[i][j]);
          part[i][j] = _mm512_fmadd_ps(xh, whi[j], part[i][j]);
        }
      }
    }
    for (int i = 0; i < MB; ++i) {
      const float xs = a.xscale[(m + i) * KB + g] * 256.0f;  // 256: decode32's 2^-8
      for (int j = 0; j < NB; ++j) {
        const __m512 s = _mm512_set1_ps(a.wscale[((n + j) / kBlock) * KB + g] * xs);
        total[i][j] = _mm512_fmadd_ps(part[i][j], s, total[i][j]);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) a.out[(m + i) * a.N + n + j] = _mm512_reduce_add_ps(total[i][j]);
}

// all rows against channels n .. n + NB - 1; with more rows than
// kDecodeOnceRows the NB weight rows are decoded once into buf ([NB][K])
template <int NB>
void channels(const fdx86::Fp8LinearArgs& a, int64_t n, float* buf) {
  const float* wbuf = nullptr;
  if (a.M > kDecodeOnceRows) {
    for (int j = 0; j < NB; ++j)
      for (int64_t k = 0; k < a.K; k += 32) {
        __m512 lo, hi;
        decode32(a.w + (n + j) * a.K + k, a.K - k, &lo, &hi);
        _mm512_mask_storeu_ps(buf + j * a.K + k, mask16(a.K - k), lo);
        _mm512_mask_storeu_ps(buf + j * a.K + k + 16, mask16(a.K - k - 16), hi);
      }
    wbuf = buf;
  }
  const int64_t full = a.M / kRows * kRows;
  for (int64_t m = 0; m < full; m += kRows) tile<kRows, NB>(a, m, n, wbuf);
  for (int64_t m = full; m < a.M; ++m) tile<1, NB>(a, m, n, wbuf);
}

}  // namespace

namespace fdx86 {

void fp8_quantize_rows_avx512(const float* x, int64_t M, int64_t K, float* xq, float* xscale, int threads) {
  const int64_t KB = (K + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && M * K >= (1 << 16))
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < KB; ++g) {
      const int64_t k0 = g * kBlock, k1 = k0 + kBlock < K ? k0 + kBlock : K;
      __m512 amax = _mm512_setzero_ps();
      for (int64_t k = k0; k < k1; k += 16)
        amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask16(k1 - k), x + m * K + k)));
      const float s = std::fmax(_mm512_reduce_max_ps(amax), 1e-10f) / kE4m3Max;
      xscale[m * KB + g] = s;
      const __m512 vs = _mm512_set1_ps(s), lim = _mm512_set1_ps(kE4m3Max);
      for (int64_t k = k0; k < k1; k += 16) {
        const __mmask16 mk = mask16(k1 - k);
        __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(mk, x + m * K + k), vs);
        v = _mm512_min_ps(_mm512_max_ps(v, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
        _mm512_mask_storeu_ps(xq + m * K + k, mk, round_e4m3(v));
      }
    }
  }
}

void block_fp8_linear_avx512(const Fp8LinearArgs& a) {
  const int64_t items = (a.N + kChannels - 1) / kChannels;
  const bool parallel = a.threads > 1 && items > 1 && a.M * a.N * a.K >= (1 << 18);
#pragma omp parallel num_threads(a.threads) if (parallel)
  {
    float* buf = a.M > kDecodeOnceRows
                     ? static_cast<float*>(std::aligned_alloc(64, ((kChannels * a.K * 4 + 63) / 64) * 64))
                     : nullptr;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t n = item * kChannels;
      if (n + kChannels <= a.N) {
        channels<kChannels>(a, n, buf);
      } else {
        for (int64_t c = n; c < a.N; ++c) channels<1>(a, c, buf);
      }
    }
    std::free(buf);
  }
}

}  // namespace fdx86
