// AVX2 + FMA kernels for CPUs without AVX-512 (and for testing that path
// anywhere). Same tiling as the AVX-512 kernels; 8 lanes; K tails in scalar.
#include <immintrin.h>

#include <cstdint>

#pragma GCC target("avx2,fma,bmi,bmi2")

#include "tiling.h"

namespace {

using fdx86::LinearArgs;

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline int32_t hsum(__m256i v) {
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i t = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}

inline __m256i load8_i8(const void* p) {  // 8 signed bytes -> 8 x int32
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p)));
}

inline int32_t nibble(uint8_t byte, int high) {  // signed 4-bit
  const int v = high ? (byte >> 4) : (byte & 0xF);
  return v >= 8 ? v - 16 : v;
}

struct Wint8 {
  static constexpr int kMaxRows = 2;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n) {
    const int64_t K = a.K;
    const float* x = a.x + m * K;
    const int8_t* w = static_cast<const int8_t*>(a.w) + n * K;
    __m256 acc[MB][NB];
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const __m256 wv = _mm256_cvtepi32_ps(load8_i8(w + j * K + k));
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i) acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * K + k), wv, acc[i][j]);
      }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        float s = hsum(acc[i][j]);
        for (int64_t t = k; t < K; ++t) s += x[i * K + t] * static_cast<float>(w[j * K + t]);
        a.out[(m + i) * a.N + n + j] = s * a.scales[n + j];
      }
  }
};

struct Wint4 {
  static constexpr int kMaxRows = 2;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n) {
    const int64_t Kh = a.K / 2, gh = a.group_size / 2;
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + n * Kh;
    __m256 acc[MB][NB];
    float tail[MB][NB] = {};
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_setzero_ps();
    for (int64_t g = 0; g < a.groups; ++g) {
      __m256 sc[NB];
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) sc[j] = _mm256_set1_ps(a.scales[(n + j) * a.groups + g]);
      const int64_t b1 = min64((g + 1) * gh, Kh);
      int64_t b = g * gh;
      for (; b + 8 <= b1; b += 8) {
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          const __m256i v = load8_i8(w + j * Kh + b);
          const __m256 lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 28), 28)), sc[j]);
          const __m256 hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(v, 4)), sc[j]);
#pragma GCC unroll 4
          for (int i = 0; i < MB; ++i) {
            const int64_t row = (m + i) * a.ldh + b;
            acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a.xe + row), lo, acc[i][j]);
            acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a.xo + row), hi, acc[i][j]);
          }
        }
      }
      for (; b < b1; ++b)
        #pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          const uint8_t byte = w[j * Kh + b];
          const float s = a.scales[(n + j) * a.groups + g];
          const float lo = static_cast<float>(nibble(byte, 0)) * s, hi = static_cast<float>(nibble(byte, 1)) * s;
          #pragma GCC unroll 4
          for (int i = 0; i < MB; ++i) {
            const int64_t row = (m + i) * a.ldh + b;
            tail[i][j] += a.xe[row] * lo + a.xo[row] * hi;
          }
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) a.out[(m + i) * a.N + n + j] = hsum(acc[i][j]) + tail[i][j];
  }
};

// No VNNI: vpmaddubsw (u8 x s8 -> s16 pairs) on |xq| and sign(w, xq), which
// cannot saturate for |w| <= 127 (2 * 127 * 127 < 32767; the contract's
// weights are in [-127, 127]), then vpmaddwd with ones -> int32.
struct W8A8 {
  static constexpr int kMaxRows = 2;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n) {
    const int64_t K = a.K;
    const int8_t* x = a.xq + m * a.ldq;
    const int8_t* w = static_cast<const int8_t*>(a.w) + n * K;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[MB][NB];
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      __m256i xv[MB], xa[MB];
      #pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i * a.ldq + k));
        xa[i] = _mm256_abs_epi8(xv[i]);
      }
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * K + k));
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i) {
          const __m256i p = _mm256_maddubs_epi16(xa[i], _mm256_sign_epi8(wv, xv[i]));
          acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(p, ones));
        }
      }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) {
      const float s = a.xscale[m + i];
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        int32_t dot = hsum(acc[i][j]);
        for (int64_t t = k; t < K; ++t) dot += static_cast<int32_t>(x[i * a.ldq + t]) * w[j * K + t];
        a.out[(m + i) * a.N + n + j] = static_cast<float>(dot) * s * a.scales[n + j];
      }
    }
  }
};

}  // namespace

namespace fdx86 {

void quantize_rows_avx2(const float* x, int64_t M, int64_t K, int8_t* xq, int64_t ldq,
                        float* xscale, int32_t* xsum, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && M * K >= (1 << 16))
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * K;
    int8_t* q = xq + m * ldq;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 mx = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(r + k), absmask));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    float amax = 0.0f;
    for (float v : lanes) amax = v > amax ? v : amax;
    for (; k < K; ++k) {
      const float v = r[k] < 0 ? -r[k] : r[k];
      amax = v > amax ? v : amax;
    }
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    const __m256 vs = _mm256_set1_ps(s);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i sum = _mm256_setzero_si256();
    alignas(32) int32_t qs[8];
    for (k = 0; k + 8 <= K; k += 8) {
      __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(r + k), vs));  // nearest even
      v = _mm256_min_epi32(_mm256_max_epi32(v, lo), hi);
      sum = _mm256_add_epi32(sum, v);
      _mm256_store_si256(reinterpret_cast<__m256i*>(qs), v);
      for (int t = 0; t < 8; ++t) q[k + t] = static_cast<int8_t>(qs[t]);
    }
    int32_t total = hsum(sum);
    for (; k < K; ++k) {
      int32_t v = _mm_cvtss_si32(_mm_set_ss(r[k] / s));  // nearest even, as above
      v = v < -127 ? -127 : (v > 127 ? 127 : v);
      q[k] = static_cast<int8_t>(v);
      total += v;
    }
    for (k = K; k < ldq; ++k) q[k] = 0;
    xscale[m] = s;
    xsum[m] = total;
  }
}

void wint8_avx2(const LinearArgs& a) { drive<Wint8>(a); }
void wint4_avx2(const LinearArgs& a) { drive<Wint4>(a); }
void w8a8_avx2(const LinearArgs& a) { drive<W8A8>(a); }

}  // namespace fdx86
