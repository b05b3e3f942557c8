// AVX-512 kernels (F, BW, VL, DQ + VNNI for w8a8). Compiled for that ISA by
// the pragma below and only called after __builtin_cpu_supports says so.
#include <immintrin.h>

#include <cstdint>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,bmi,bmi2")

#include "tiling.h"
#include "packed_drive.h"

namespace {

using fdx86::LinearArgs;

inline __m128i hsum4(__m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i abcd = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

template <int MB, int NB>
inline void reduce_store(const __m512 (&acc)[MB][NB], float (&sums)[MB][NB]) {
  #pragma GCC unroll 4
  for (int i = 0; i < MB; ++i) {
    if constexpr (NB == 4) {
      _mm_storeu_ps(sums[i], hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
    } else {
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) sums[i][j] = _mm512_reduce_add_ps(acc[i][j]);
    }
  }
}

inline __mmask64 mask64(int64_t n) { return n >= 64 ? ~0ULL : ((1ULL << n) - 1ULL); }

// ------------------------------------------------------------------ wint8
// x fp32; int8 weights widened to fp32 in registers (vpmovsxbd + cvtdq2ps),
// FMA along K; the per-channel scale is applied once to the dot product.
struct Wint8 {
  static constexpr int kMaxRows = 4;

  template <int MB, int NB>
  static inline void step(const float* x, int64_t K, const int8_t* w, int64_t k, __mmask16 mk,
                          __m512 (&acc)[MB][NB], RunPrefetch& pf) {
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      if (k % 64 == 0) pf.next();  // tiling.h (B=1 mid-size MoE, wint8 experts on fp32 activations: 1.03x)
      const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, w + j * K + k)));
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i)
        acc[i][j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + i * K + k), wv, acc[i][j]);
    }
  }

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n) {
    const int64_t K = a.K;
    const float* x = a.x + m * K;
    const int8_t* w = static_cast<const int8_t*>(a.w) + n * K;
    RunPrefetch pf(w, kContractPrefetch);
    __m512 acc[MB][NB];
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) step<MB, NB>(x, K, w, k, (__mmask16)0xFFFF, acc, pf);
    if (k < K) step<MB, NB>(x, K, w, k, mask16(K - k), acc, pf);
    float sums[MB][NB];
    reduce_store<MB, NB>(acc, sums);
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) a.out[(m + i) * a.N + n + j] = sums[i][j] * a.scales[n + j];
  }
};

// ------------------------------------------------------------------ wint4
// 16 bytes = 32 weights per step: sign-extend the bytes to int32, the low
// nibble is (v << 28) >> 28 and the high nibble v >> 4 (arithmetic shifts);
// times the group scale, FMA with x's even / odd inputs (split beforehand).
struct Wint4 {
  static constexpr int kMaxRows = 4;

  template <int MB, int NB>
  static inline void step(const LinearArgs& a, int64_t m, const uint8_t* w, int64_t Kh, int64_t b,
                          __mmask16 mk, const __m512 (&sc)[NB], __m512 (&acc)[MB][NB]) {
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      if (b % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(w + (j + NB) * Kh + b), _MM_HINT_T1);
      const __m512i v = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, w + j * Kh + b));
      const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 28), 28)), sc[j]);
      const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(v, 4)), sc[j]);
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        const int64_t row = (m + i) * a.ldh + b;
        acc[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(a.xe + row), lo, acc[i][j]);
        acc[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(a.xo + row), hi, acc[i][j]);
      }
    }
  }

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n) {
    const int64_t Kh = a.K / 2, gh = a.group_size / 2;
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + n * Kh;
    __m512 acc[MB][NB];
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < a.groups; ++g) {
      __m512 sc[NB];
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) sc[j] = _mm512_set1_ps(a.scales[(n + j) * a.groups + g]);
      const int64_t b1 = min64((g + 1) * gh, Kh);
      int64_t b = g * gh;
      for (; b + 16 <= b1; b += 16) step<MB, NB>(a, m, w, Kh, b, (__mmask16)0xFFFF, sc, acc);
      if (b < b1) step<MB, NB>(a, m, w, Kh, b, mask16(b1 - b), sc, acc);  // x is zero padded
    }
    float sums[MB][NB];
    reduce_store<MB, NB>(acc, sums);
    #pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) a.out[(m + i) * a.N + n + j] = sums[i][j];
  }
};

// ------------------------------------------------------------------- w8a8
// vpdpbusd multiplies unsigned by signed bytes. The weights are made the
// unsigned operand by flipping their sign bit (w + 128, one vpxor per 64
// weights, shared by the MB rows), activations stay signed:
//   sum (w + 128) * xq = sum w * xq + 128 * sum xq,
// so the correction is per token (a.xsum), not per output channel.
struct W8A8 {
  static constexpr int kMaxRows = 4;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n) {
    const int64_t K = a.K, ldq = a.ldq;
    const int8_t* x = a.xq + m * ldq;
    const int8_t* w = static_cast<const int8_t*>(a.w) + n * K;
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    RunPrefetch pf(w, kContractPrefetch);  // tiling.h (B=1 w8a8 experts: mid-size MoE 1.55x, 21B widths 1.16x)
    __m512i acc[MB][NB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_si512();
    // One loop for body and tail: x is zero padded to ldq, W's tail masked
    // (masked-off bytes become 0x80 = 128, times xq = 0 past K).
    for (int64_t k = 0; k < K; k += 64) {
      const __mmask64 mk = mask64(K - k);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        pf.next();
        const __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, w + j * K + k), flip);
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i)
          acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv, _mm512_loadu_si512(x + i * ldq + k));
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) {
      int32_t sums[NB];
      if constexpr (NB == 4) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(sums), hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
      } else {
        #pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) sums[j] = _mm512_reduce_add_epi32(acc[i][j]);
      }
      const int32_t comp = 128 * a.xsum[m + i];
      const float s = a.xscale[m + i];
      #pragma GCC unroll 4
      for (int j = 0; j < NB; ++j)
        a.out[(m + i) * a.N + n + j] = static_cast<float>(sums[j] - comp) * s * a.scales[n + j];
    }
  }
};


// ============================================================ packed layouts
// One-time repacks of the contract weights (fd_x86/linear.py, cached on the
// QuantizedWeight) into blocks of 16 output channels, so a zmm holds one
// value per channel and the inner loop is broadcast(x) x packed weights:
// no horizontal sums, W read as NB sequential streams.
//   wint8: int8  [N32][K][32]: two 16-channel blocks side by side per k, so a
//          work item reads one stream (channels past N are 0)
//   wint4: uint8 [N16][K/2][16] (the contract's bytes), scales [N16][G][16];
//          where K and the group size are multiples of 8, uint32 words
//          of 8 codes each instead, blocks in groups of 4, each group
//          [K/8][its blocks][16] (Wint4Words; kernels.h kWordGroup)
//   w8a8:  uint8 [N16][K4][16][4] = w ^ 0x80  (K padded to 4 with w = 0)
// Work items: kBlocks blocks (32 channels); register tiles MB rows x NB blocks
// (packed_drive.h).

inline int32_t load_i32(const void* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

struct Wint8Packed {
  static constexpr int kMaxRows = 8;
  static constexpr int kBlocks = 2;
  static constexpr int64_t kRow = kBlocks * 16;  // bytes per k of a work item's [K][32] stream

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t nb0) {
    // few rows: U independent accumulator sets along k hide the FMA latency
    constexpr int U = MB == 1 ? 4 : (MB == 2 ? 2 : 1);
    const int64_t K = a.K;
    const int8_t* w = static_cast<const int8_t*>(a.w) + nb0 * K * 16;  // nb0: a multiple of kBlocks
    const float* x = a.x + m * K;
    __m512 acc[U][MB][NB];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) acc[u][i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + U <= K; k += U) {
      // one prefetch per 64-byte line of the stream
      if constexpr (U >= 2) {
#pragma GCC unroll 4
        for (int p = 0; p < U / 2; ++p) prefetch_ahead(w + k * kRow + p * 64);
      } else if ((k & 1) == 0) {
        prefetch_ahead(w + k * kRow);
      }
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (k + u) * kRow + j * 16))));
#pragma GCC unroll 8
          for (int i = 0; i < MB; ++i)
            acc[u][i][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * K + k + u]), wv, acc[u][i][j]);
        }
      }
    }
    for (; k < K; ++k) {
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k * kRow + j * 16))));
#pragma GCC unroll 8
        for (int i = 0; i < MB; ++i) acc[0][i][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * K + k]), wv, acc[0][i][j]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const int64_t n = (nb0 + j) * 16;
      const __m512 sc = _mm512_maskz_loadu_ps(mask16(a.N - n), a.scales + n);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        __m512 s = acc[0][i][j];
#pragma GCC unroll 4
        for (int u = 1; u < U; ++u) s = _mm512_add_ps(s, acc[u][i][j]);
        store16(a, m + i, nb0 + j, _mm512_mul_ps(s, sc));
      }
    }
  }
};

// Per group: the integer nibbles times x accumulate in fp32, then one FMA
// with the group's 16 channel scales. Up to 2 rows keep the low and high
// nibbles' sums apart (more FMA chains in flight); more rows share one.
struct Wint4Packed {
  static constexpr int kMaxRows = 6;
  static constexpr int kBlocks = 2;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t nb0) {
    constexpr int H = MB <= 2 ? 2 : 1;  // group accumulator sets
    const int64_t K = a.K, Kh = K / 2, gh = a.group_size / 2, G = a.groups;
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + nb0 * Kh * 16;
    const float* sp = a.scales + nb0 * G * 16;
    const float* x = a.x + m * K;
    __m512 acc[MB][NB];
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const int64_t b1 = min64((g + 1) * gh, Kh);
      __m512 gacc[H][MB][NB];
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
        for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) gacc[h][i][j] = _mm512_setzero_ps();
      for (int64_t b = g * gh; b < b1; ++b) {
        if ((b & 3) == 0) {
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) prefetch_ahead(w + (j * Kh + b) * 16);
        }
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          const __m512i v = _mm512_cvtepi8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (j * Kh + b) * 16)));
          const __m512 lo = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 28), 28));
          const __m512 hi = _mm512_cvtepi32_ps(_mm512_srai_epi32(v, 4));
#pragma GCC unroll 8
          for (int i = 0; i < MB; ++i) {
            gacc[0][i][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * K + 2 * b]), lo, gacc[0][i][j]);
            gacc[H - 1][i][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * K + 2 * b + 1]), hi, gacc[H - 1][i][j]);
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

// wint4 in words, where K and the group size are multiples of 8: uint32
// words in groups of 4 blocks (kernels.h word_block), word (kb, c) of a block
// = its channel c's codes of inputs 8kb .. 8kb+7,
// input 8kb+t in bits 4t..4t+3: the contract's bytes 4kb .. 4kb+3 read as a
// little-endian uint32. One 64-byte load brings 128 codes; a code becomes
// fp32 in one vpermps (its low 4 bits index the 16 values -8..7), the next
// code is a 4-bit shift away: per 16 weights a shift, a vpermps and an FMA
// per row, against Wint4Packed's 8 instructions per 32 (sign-extend, two
// shift pairs, two conversions). The accumulation is Wint4Packed's, term for
// term (even / odd inputs apart up to 2 rows, in input order): the same bits.
// At 1-3 rows a work item takes 4 blocks (8 FMA chains at 1 row, where
// Wint4Packed's 2 blocks had 4): one thread on Zen 4, the 0.3B's int4 LM
// head at 1 row went 4.1 -> 2.7 ms (wint8's packed head: 4.0 ms, so int4
// had cost as much as int8); 8 blocks spill. Compute still bounds it there
// (~20 GB/s of codes per thread against ~30 GB/s read).
// Its steps in packed_drive.h's Wint4WordsTile: 8 per word, each a vpermps
// and an FMA with the row's broadcast fp32 activation.
struct Fp32Codes {
  static constexpr int kSteps = 8;
  const float* x;
  int64_t K;
  __m512 values;
  Fp32Codes(const LinearArgs& a, int64_t m)
      : x(a.x + m * a.K), K(a.K), values(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1)) {}
  __m512 codes(__m512i v) const { return _mm512_permutexvar_ps(v, values); }  // low 4 bits index
  __m512 madd(__m512 s, __m512 f, int i, int64_t kb, int t) const {
    return _mm512_fmadd_ps(_mm512_set1_ps(x[i * K + kb * 8 + t]), f, s);
  }
};

template <int Blocks, int MaxRows>
using Wint4Words = Wint4WordsTile<Fp32Codes, Blocks, MaxRows>;

// vpdpbusd(acc, w ^ 0x80 (u8, 16 channels x 4 k), broadcast 4 xq bytes (s8)):
// 16 channel dot products, no horizontal sum; 128 * sum(xq) is taken off
// per token as before. The same int32 sums as the contract: exact.
struct W8A8Packed {
  static constexpr int kMaxRows = 8;
  static constexpr int kBlocks = 2;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t nb0) {
    const int64_t K4 = (a.K + 3) / 4, ldq = a.ldq;
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + nb0 * K4 * 64;
    const int8_t* x = a.xq + m * ldq;
    // one row: two accumulator sets along k hide vpdpbusd's latency
    constexpr int U = MB == 1 ? 2 : 1;
    __m512i acc[U][MB][NB];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) acc[u][i][j] = _mm512_setzero_si512();
    int64_t kb = 0;
    for (; kb + U <= K4; kb += U) {
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        __m512i wv[NB];
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          prefetch_ahead(w + (j * K4 + kb + u) * 64);
          wv[j] = _mm512_loadu_si512(w + (j * K4 + kb + u) * 64);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MB; ++i) {
          const __m512i xb = _mm512_set1_epi32(load_i32(x + i * ldq + (kb + u) * 4));
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) acc[u][i][j] = _mm512_dpbusd_epi32(acc[u][i][j], wv[j], xb);
        }
      }
    }
    for (; kb < K4; ++kb) {
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const __m512i wv = _mm512_loadu_si512(w + (j * K4 + kb) * 64);
#pragma GCC unroll 8
        for (int i = 0; i < MB; ++i)
          acc[0][i][j] = _mm512_dpbusd_epi32(acc[0][i][j], wv, _mm512_set1_epi32(load_i32(x + i * ldq + kb * 4)));
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const int64_t n = (nb0 + j) * 16;
      const __m512 sc = _mm512_maskz_loadu_ps(mask16(a.N - n), a.scales + n);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        __m512i s = acc[0][i][j];
#pragma GCC unroll 4
        for (int u = 1; u < U; ++u) s = _mm512_add_epi32(s, acc[u][i][j]);
        s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * a.xsum[m + i]));
        // (float(dot) * s_t) * scale, two roundings in the contract's order
        const __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a.xscale[m + i])), sc);
        store16(a, m + i, nb0 + j, y);
      }
    }
  }
};

}  // namespace

namespace fdx86 {

void quantize_rows_avx512(const float* x, int64_t M, int64_t K, int8_t* xq, int64_t ldq,
                          float* xscale, int32_t* xsum, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && M * K >= (1 << 16))
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * K;
    int8_t* q = xq + m * ldq;
    __m512 mx = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16)
      mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask16(K - k), r + k)));
    const float amax = _mm512_reduce_max_ps(mx);
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    const __m512 vs = _mm512_set1_ps(s);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    __m512i sum = _mm512_setzero_si512();
    int64_t k = 0;
    for (; k < K; k += 16) {
      const __mmask16 mk = mask16(K - k);
      // cvtps2dq rounds to nearest even (the default MXCSR mode), like rint
      __m512i v = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_maskz_loadu_ps(mk, r + k), vs));
      v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
      sum = _mm512_add_epi32(sum, v);
      _mm_mask_storeu_epi8(q + k, mk, _mm512_cvtepi32_epi8(v));
    }
    for (k = K; k < ldq; ++k) q[k] = 0;
    xscale[m] = s;
    xsum[m] = _mm512_reduce_add_epi32(sum);
  }
}

void wint8_avx512(const LinearArgs& a) { drive<Wint8>(a); }
void wint4_avx512(const LinearArgs& a) { drive<Wint4>(a); }
void w8a8_avx512_vnni(const LinearArgs& a) { drive<W8A8>(a); }

void wint8_packed_avx512(const LinearArgs& a) { drive_packed<Wint8Packed>(a); }
// the layout fd_x86.linear.pack_weight chose by the same rule
void wint4_packed_avx512(const LinearArgs& a) {
  if (a.K % 8 != 0 || a.group_size % 8 != 0) drive_packed<Wint4Packed>(a);
  else if (a.M <= 3) drive_packed<Wint4Words<4, 3>>(a);  // decode: more chains per row
  else drive_packed<Wint4Words<2, 6>>(a);
}
void w8a8_packed_avx512_vnni(const LinearArgs& a) { drive_packed<W8A8Packed>(a); }


// 16 lanes, each keeping its largest value and where it first saw it (a later equal value does not move it),
// and whether it saw a NaN; then the lanes' best, ties to the lowest index. A NaN anywhere: the first one.
int64_t greedy_token_avx512(const float* x, int64_t n) {
  int64_t i = 0;
  if (n >= 16) {
    __m512 best = _mm512_loadu_ps(x);
    __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i idx = at;
    const __m512i sixteen = _mm512_set1_epi32(16);
    __mmask16 nan = _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q);
    for (i = 16; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      idx = _mm512_add_epi32(idx, sixteen);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      const __mmask16 more = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
      best = _mm512_mask_mov_ps(best, more, v);
      at = _mm512_mask_mov_epi32(at, more, idx);
    }
    if (nan == 0) {
      alignas(64) float lane_best[16];
      alignas(64) int32_t lane_at[16];
      _mm512_store_ps(lane_best, best);
      _mm512_store_si512(lane_at, at);
      float top = lane_best[0];
      int64_t where = lane_at[0];
      for (int l = 1; l < 16; ++l) {
        if (lane_best[l] > top || (lane_best[l] == top && lane_at[l] < where)) {
          top = lane_best[l];
          where = lane_at[l];
        }
      }
      for (int64_t j = i; j < n; ++j) {
        if (x[j] != x[j]) return j;  // a NaN in the tail: after every lane's, none of which had one
        if (x[j] > top) {
          top = x[j];
          where = j;
        }
      }
      return where;
    }
  }
  for (int64_t j = 0; j < n; ++j) {  // short rows, or a NaN: the scalar rule
    if (x[j] != x[j]) return j;
  }
  int64_t where = 0;
  for (int64_t j = 1; j < n; ++j) {
    if (x[j] > x[where]) where = j;
  }
  return where;
}

}  // namespace fdx86

namespace {

// exp(x) on 8 doubles for x in [-700, 0]: x = n ln2 + r (ln2 split in two, fdlibm's constants, so n ln2's high
// part is exact), |r| <= ln2 / 2, exp(r) by its Taylor series to r^13 / 13! (truncation < 1e-17 relative),
// then scaled by 2^n. Within a few ulp of the correctly rounded value.
inline __m512d exp_pd(__m512d x) {
  const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), x);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
  static constexpr double kInvFactorial[14] = {
      1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880,
      1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800};
  __m512d p = _mm512_set1_pd(kInvFactorial[13]);
  for (int k = 12; k >= 0; --k) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFactorial[k]));
  return _mm512_scalef_pd(p, n);
}

}  // namespace

namespace fdx86 {

int64_t sample_weights_avx512(const float* x, int64_t n, double temperature, double top, double min_p, double cut,
                              double* w, int64_t* nonzero) {
  const __m512d t = _mm512_set1_pd(temperature), tp = _mm512_set1_pd(top), lo = _mm512_set1_pd(cut);
  const __m512d mp = _mm512_set1_pd(min_p);
  const __m512i eight = _mm512_set1_epi64(8);
  __m512i idx = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t found = 0;
  for (int64_t i = 0; i < n; i += 8, idx = _mm512_add_epi64(idx, eight)) {
    const __mmask8 lanes = n - i >= 8 ? __mmask8(0xFF) : __mmask8((1u << (n - i)) - 1);
    const __m512d z = _mm512_div_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(lanes, x + i)), t);
    const __m512d d = _mm512_sub_pd(z, tp);
    const __mmask8 live = _mm512_cmp_pd_mask(d, lo, _CMP_GE_OQ);  // false for -inf (and NaN)
    const __m512d e = exp_pd(_mm512_max_pd(d, lo));
    const __mmask8 keep = live & _mm512_cmp_pd_mask(e, mp, _CMP_GE_OQ);
    _mm512_mask_storeu_pd(w + i, lanes, _mm512_maskz_mov_pd(keep, e));
    const __mmask8 in = keep & lanes;
    if (in) {
      _mm512_storeu_si512(nonzero + found, _mm512_maskz_compress_epi64(in, idx));  // 8 slots of room: see kernels.h
      found += __builtin_popcount(in);
    }
  }
  return found;
}

int64_t sample_gather_avx512(const double* w, int64_t n, double lo, double hi, int64_t* ids) {
  int64_t found = 0;
  const __m512d l = _mm512_set1_pd(lo), h = _mm512_set1_pd(hi);
  const __m512i eight = _mm512_set1_epi64(8);
  __m512i idx = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t i = 0;
  // a compress into a register and a whole store: on Zen 4 a compress straight to memory is microcoded (slow)
  for (; i + 8 <= n; i += 8, idx = _mm512_add_epi64(idx, eight)) {
    const __m512d v = _mm512_loadu_pd(w + i);
    const __mmask8 in = _mm512_cmp_pd_mask(v, l, _CMP_GE_OQ) & _mm512_cmp_pd_mask(v, h, _CMP_LT_OQ);
    if (in) {
      _mm512_storeu_si512(ids + found, _mm512_maskz_compress_epi64(in, idx));
      found += __builtin_popcount(in);
    }
  }
  for (; i < n; ++i) {
    if (w[i] >= lo && w[i] < hi) ids[found++] = i;
  }
  return found;
}

}  // namespace fdx86
